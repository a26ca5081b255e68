"""matplotlib, optional: every result plot of the project is drawn through pyplot(), and skipped without it."""


def pyplot():
    """matplotlib.pyplot drawing into files (no screen needed), or None where matplotlib is not installed: a plot
    is an extra beside its table, never a reason to fail."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
