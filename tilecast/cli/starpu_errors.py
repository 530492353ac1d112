"""How the commands that run StarPU report its absence or failure."""

from __future__ import annotations

import contextlib
import functools
import sys

from tilecast.cli import UsageError


class StarPUFailed(Exception):
    """StarPU started but failed; reported as one line, exit status 1."""


@contextlib.contextmanager
def starpu_errors(command: str):
    """StarPU or the C kernels missing: exit 2 naming the packages to install; StarPU failing: one line, exit 1."""
    from tilecast.executor.starpu_session import StarPUError
    from tilecast.kernels.native_build import NativeUnavailable

    try:
        yield
    except NativeUnavailable as e:
        raise UsageError(str(e)) from None
    except StarPUError as e:
        raise StarPUFailed(f"tilecast {command}: {e}") from None


def with_starpu_errors(command: str):
    """Decorate a command's ``run``: StarPU failures become one line on standard error and exit status 1."""

    def wrap(run):
        @functools.wraps(run)
        def inner(args) -> int:
            try:
                with starpu_errors(command):
                    return run(args)
            except StarPUFailed as e:
                print(str(e), file=sys.stderr)
                return 1

        return inner

    return wrap
