"""The CLI's two consoles, stdout and stderr, made on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console


class LazyConsole:
    """A rich Console made on first use, so commands that print little do not pay for importing rich."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self._console: Console | None = None

    def _get(self) -> Console:
        if self._console is None:
            from rich.console import Console

            self._console = Console(**self._kwargs)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self._get(), name)

    # Dunder methods bypass __getattr__; rich's Live and Progress enter the console as a context manager.
    def __enter__(self) -> Console:
        return self._get().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._get().__exit__(*exc)


out: Console = LazyConsole(highlight=False, soft_wrap=True)  # type: ignore[assignment]
err: Console = LazyConsole(stderr=True, highlight=False, soft_wrap=True)  # type: ignore[assignment]
