"""Small statistics helpers."""


def mean(values):
    """The arithmetic mean of a non-empty list of numbers."""
    return sum(values) / len(values)


def median(values):
    """The median of a non-empty list of numbers."""
    middle = len(values) // 2
    return values[middle]
