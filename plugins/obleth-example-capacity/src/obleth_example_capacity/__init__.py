"""An example Obleth plugin; the hooks live in ``obleth_example_capacity.plugin``."""
