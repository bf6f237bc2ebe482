"""A deliberately broken Obleth plugin; importing ``.plugin`` fails."""
