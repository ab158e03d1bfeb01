"""Python client of idempotency-ledger, the arbiter that lets an AI agent's side-effecting tool
call happen once: claim before acting, complete with the result, replay on repeat.

    from idempotency_ledger import Ledger

    with Ledger("127.0.0.1:50051") as ledger:
        result = ledger.run_once(run_id, "issue_credit", {"customer": "c-42", "amount": 200},
                                 lambda attempt: payments.credit(..., memo=attempt.external_ref))
        result.value, result.replayed, result.note

See README.md beside the package, and the modules: ``client`` (Ledger, AsyncLedger, run_once),
``errors`` (typed errors), ``keys`` (local key derivation), ``model`` (entries and answers),
``codec`` (result encoding), ``testing`` (a real server for tests).
"""

from .client import AsyncLedger, Ledger
from .codec import BYTES, JSON, BytesCodec, Codec, JsonCodec
from .errors import (
    AlreadyResolved,
    DeadlineExceeded,
    FailedPrecondition,
    InProgressError,
    InternalError,
    InvalidArgument,
    KeyReused,
    LedgerError,
    NotExecuted,
    NotFound,
    OutcomeUnknownError,
    PermanentFailure,
    PreviouslyFailedError,
    ResourceExhausted,
    StaleClaimToken,
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
    Attempt,
    Canonicalization,
    ClaimResult,
    Completion,
    Entry,
    Outcome,
    Reconciliation,
    Resolution,
    Result,
    Status,
)

__all__ = [
    "BYTES",
    "JSON",
    "AlreadyResolved",
    "ArgumentsRefused",
    "AsyncLedger",
    "Attempt",
    "BytesCodec",
    "Canonicalization",
    "ClaimResult",
    "Codec",
    "Completion",
    "DeadlineExceeded",
    "Entry",
    "FailedPrecondition",
    "InProgressError",
    "InternalError",
    "InvalidArgument",
    "JsonCodec",
    "KeyReused",
    "Ledger",
    "LedgerError",
    "NotExecuted",
    "NotFound",
    "Outcome",
    "OutcomeUnknownError",
    "PermanentFailure",
    "PreviouslyFailedError",
    "Reconciliation",
    "Resolution",
    "ResourceExhausted",
    "Result",
    "StaleClaimToken",
    "Status",
    "Unauthenticated",
    "Unavailable",
    "arguments_json",
    "canonicalize",
    "derive_key",
    "external_ref",
    "fingerprint",
]
