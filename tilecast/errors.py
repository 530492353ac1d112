"""The error a library function raises for a value it cannot take.

Its message starts with the name of the argument or field at fault ("workers
must be between 1 and 2 ...", "sched: unknown scheduler ..."), so that a
notebook user reads about the argument and the command line, which catches
this class (and the model and tiling errors) alone, names the matching flag
(``tilecast.cli.common.as_flags``). Any other exception is a fault, not bad
input. Every package may import this module; it imports nothing of tilecast.
"""


class FieldError(ValueError):
    """A value that a function cannot take; the message starts with the field's name."""

    @property
    def field(self) -> str:
        """The field the message starts with ("ranks" of "ranks: the data distribution needs ..."), or ""."""
        head = str(self).split(" ", 1)[0].split(":", 1)[0]
        return head if head.replace("_", "").replace("/", "").isalpha() and head.islower() else ""

    @property
    def detail(self) -> str:
        """The message without its leading "field: " ("the data distribution needs ...")."""
        text = str(self)
        return text.split(": ", 1)[1] if self.field and text.startswith(self.field + ": ") else text
