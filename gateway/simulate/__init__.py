"""``obleth simulate``: capacity planning on a virtual clock, through Obleth's own
admission and router to simulated instances (see docs/simulate.md)."""
