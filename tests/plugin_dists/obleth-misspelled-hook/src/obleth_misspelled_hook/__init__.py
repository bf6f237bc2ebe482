"""An Obleth plugin whose hook name has a typo; see ``.plugin``."""
