"""One call of a ``@ledger.tool()`` function, prepared for the ledger before anything is
claimed: its run id (``run_id=``, :func:`run_scope`, or the framework's context), the arguments
it records in their JSON form, and the framework's context and own timeout among them
(:class:`ToolCall`). ``tools`` wraps the function with it and exports :func:`run_scope` and
:func:`current_run_id`."""

from __future__ import annotations

import contextvars
import inspect
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ._confirm import check_confirm
from ._frameworks import FrameworkContext, framework_context, unregistered_framework
from ._views import missing_run_id, missing_run_id_view
from .codec import to_jsonable
from .model import UnknownAttempt

Confirm = Callable[[UnknownAttempt], Any]

_run_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "idempotency_ledger.run_id", default=None)


def current_run_id() -> str | None:
    """The run id set by the innermost :func:`run_scope`, if any."""
    return _run_id.get()


@contextmanager
def run_scope(run_id: str) -> Iterator[str]:
    """Ledger tools called inside key their calls by `run_id` (unless given ``run_id=``)::

        with run_scope(f"{conversation_id}:{turn}"):
            agent.run_sync(prompt)
    """
    if not isinstance(run_id, str) or not run_id:
        raise ValueError(f"run_scope needs a non-empty run id, not {run_id!r}")
    token = _run_id.set(run_id)
    try:
        yield run_id
    finally:
        _run_id.reset(token)


@dataclass(frozen=True)
class Prepared:
    """One call of a decorated function, ready for the ledger."""

    run_id: str
    arguments: dict[str, Any]
    #: The framework's own timeout of the call (its name, seconds), if it has one.
    framework_timeout: tuple[str, float] | None
    #: The framework's context among the arguments (and how it is read), if any.
    context: FrameworkContext | None = None
    context_value: Any = None


class ToolCall:
    """How one decorated function is called through the ledger: its signature, what it records,
    and where its run id comes from."""

    def __init__(self, fn: Callable[..., Any], name: str | None, run_id: Any,
                 exclude: Collection[str], not_executed: tuple[type[BaseException], ...],
                 confirm: Confirm | None, options: dict[str, Any]) -> None:
        if not callable(fn):
            raise TypeError(f"ledger.tool() decorates a function, not {fn!r}")
        if run_id is not None and not (isinstance(run_id, str) and run_id) and not callable(
                run_id):
            raise TypeError(f"run_id must be a non-empty str or a callable, not {run_id!r}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", None) or ""
        if not self.name:
            raise ValueError(f"{fn!r} has no __name__: give the tool a name")
        if confirm is not None:
            check_confirm(confirm, self.name)
        self.signature = signature_of(fn)
        unknown = set(exclude) - set(self.signature.parameters)
        if unknown:
            raise ValueError(f"exclude names no parameter of {self.name}: {sorted(unknown)}")
        self.exclude = frozenset(exclude)
        self.run_id_option = run_id
        self.not_executed = not_executed
        self.confirm = confirm
        self.options = options

    def prepare(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Prepared | dict[str, str]:
        """The run id, recorded arguments and framework timeout of one call, or what the model
        reads of a call refused for want of a run id where the framework would hide the
        exception from the developer; raises before anything is claimed."""
        bound = self.signature.bind(*args, **kwargs)  # the framework's TypeError, as without us
        arguments: dict[str, Any] = {}
        context_run_id: str | None = None
        context: FrameworkContext | None = None
        context_value: Any = None
        timeout: tuple[str, float] | None = None
        for pname, value in bound.arguments.items():
            if pname in self.exclude:
                continue
            found = framework_context(value)
            if found is not None:
                if context is None:
                    context, context_value = found, value
                context_run_id = context_run_id or found.run_id(value)
                seconds = found.call_timeout(value) if found.call_timeout else None
                timeout = timeout or ((found.framework, seconds) if seconds else None)
                continue
            adapter = unregistered_framework(value)
            if adapter is not None:
                raise missing_run_id(
                    self.name, f"Its parameter {pname!r} is a framework's context, whose run id "
                    f"the ledger reads once its adapter is imported: import {adapter}")
            kind = self.signature.parameters[pname].kind
            try:
                if kind is inspect.Parameter.VAR_KEYWORD:
                    arguments.update(to_jsonable(value))
                else:
                    arguments[pname] = to_jsonable(value)
            except TypeError as e:
                raise TypeError(f"ledger tool {self.name}: argument {pname!r} cannot be recorded "
                                f"as JSON: {e} (or leave it out with exclude=)") from None
        run_id = self._run_id(context_run_id)
        if run_id is not None:
            return Prepared(run_id, arguments, timeout, context, context_value)
        hint = context.run_id_hint if context is not None else (
            "give the function the framework's context parameter (see the idempotency_ledger "
            "adapters)")
        error = missing_run_id(self.name, f"Pass run_id= to ledger.tool(), call it inside "
                                          f"run_scope(run_id), or {hint}")
        if context is not None and not context.raises_reach_developer:
            return missing_run_id_view(self.name)
        raise error

    def _run_id(self, from_context: str | None) -> str | None:
        option = self.run_id_option
        run_id = option() if callable(option) else option
        run_id = run_id or _run_id.get() or from_context
        if isinstance(run_id, uuid.UUID):
            run_id = str(run_id)
        if not run_id:
            return None
        if not isinstance(run_id, str):
            raise TypeError(f"ledger tool {self.name}: the run id must be a str or a UUID, not "
                            f"{type(run_id).__name__}")
        return run_id


def signature_of(fn: Callable[..., Any]) -> inspect.Signature:
    """The function's signature, with string annotations (``from __future__ import annotations``)
    evaluated where they can be, as a framework that evaluates them would see it."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # a name only imported under TYPE_CHECKING: keep the strings
        return inspect.signature(fn)
