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
