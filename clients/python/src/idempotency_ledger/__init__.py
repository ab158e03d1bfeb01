"""Python client of idempotency-ledger, the arbiter that lets an AI agent's side-effecting tool
call happen once: claim before acting, complete with the result, replay on repeat.

    from idempotency_ledger import Ledger

    with Ledger("127.0.0.1:50051") as ledger:
        result = ledger.run_once(run_id, "issue_credit", {"customer": "c-42", "amount": 200},
                                 lambda attempt: payments.credit(..., memo=attempt.external_ref))
        result.value, result.replayed, result.note

Or one line per tool, inside an agent framework::

    @ledger.tool()
    def issue_credit(customer: str, amount: int) -> dict: ...

See README.md beside the package. The layers, each importing only from those below it (README,
"Layers"): ``model`` and ``errors``; ``codec`` and ``keys``; the ledger (``_wire``, ``_trace``,
``_core``: run-once written once, ``client``: ``LedgerClient`` and ``AsyncLedgerClient``); the tools
(``tools``: ``@ledger.tool()``, ``Ledger``, ``AsyncLedger``; ``reconciler``); and the framework
adapters, each an optional extra, imported by you and never by the rest: ``pydantic_ai``,
``openai_agents``, ``langchain``, ``mcp``. ``testing`` starts a real server for tests.
"""

from .client import (
    DEFAULT_CONFIRM_DELAY,
    DEFAULT_RETRY_BUDGET,
    DEFAULT_WAIT,
    RENEW_EVERY_FRACTION_OF_LEASE,
    AsyncLedgerClient,
    LedgerClient,
)
from .codec import BYTES, JSON, BytesCodec, Codec, JsonCodec, to_jsonable
from .errors import (
    ActionStopped,
    ActionTimeout,
    AlreadyResolved,
    BeforeActing,
    DataLoss,
    DeadlineExceeded,
    FailedPrecondition,
    InProgressError,
    InternalError,
    InvalidArgument,
    KeyReused,
    LeaseEnded,
    LedgerError,
    NotExecuted,
    NotFound,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    ResourceExhausted,
    ResultNotEncodable,
    StaleClaimToken,
    StoreFull,
    Unauthenticated,
    Unavailable,
)
from .keys import (
    ArgumentsRefused,
    arguments_json,
    canonicalize,
    derive_key,
    external_ref,
    fingerprint,
)
from .model import (
    Answer,
    Attempt,
    CallOutcome,
    Canonicalization,
    ClaimResult,
    Completion,
    Confirmation,
    Entry,
    Kind,
    Outcome,
    Reconciliation,
    Resolution,
    ResolutionOutcome,
    ResolutionResult,
    Result,
    Status,
    UnknownAttempt,
    cannot_tell,
    found,
    not_found,
)
from .reconciler import Reconciler, Settlement
from .tools import (
    AsyncLedger,
    Ledger,
    LedgerTool,
    NoRunId,
    current_attempt,
    current_run_id,
    run_scope,
)

__all__ = [
    "BYTES",
    "DEFAULT_CONFIRM_DELAY",
    "DEFAULT_RETRY_BUDGET",
    "DEFAULT_WAIT",
    "JSON",
    "RENEW_EVERY_FRACTION_OF_LEASE",
    "ActionStopped",
    "ActionTimeout",
    "AlreadyResolved",
    "Answer",
    "ArgumentsRefused",
    "AsyncLedger",
    "AsyncLedgerClient",
    "Attempt",
    "BeforeActing",
    "BytesCodec",
    "CallOutcome",
    "Canonicalization",
    "ClaimResult",
    "Codec",
    "Completion",
    "Confirmation",
    "DataLoss",
    "DeadlineExceeded",
    "Entry",
    "FailedPrecondition",
    "InProgressError",
    "InternalError",
    "InvalidArgument",
    "JsonCodec",
    "KeyReused",
    "Kind",
    "LeaseEnded",
    "Ledger",
    "LedgerClient",
    "LedgerError",
    "LedgerTool",
    "NoRunId",
    "NotExecuted",
    "NotFound",
    "Outcome",
    "OutcomeUnknownError",
    "PermanentFailure",
    "PreviouslyFailedError",
    "Reconciler",
    "Reconciliation",
    "Resolution",
    "ResolutionOutcome",
    "ResolutionResult",
    "ResourceExhausted",
    "Result",
    "ResultNotEncodable",
    "Settlement",
    "StaleClaimToken",
    "Status",
    "StoreFull",
    "Unauthenticated",
    "Unavailable",
    "UnknownAttempt",
    "arguments_json",
    "canonicalize",
    "cannot_tell",
    "current_attempt",
    "current_run_id",
    "derive_key",
    "external_ref",
    "fingerprint",
    "found",
    "not_found",
    "run_scope",
    "to_jsonable",
]
