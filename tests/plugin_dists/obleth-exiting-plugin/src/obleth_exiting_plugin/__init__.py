"""A deliberately broken Obleth plugin; importing ``.plugin`` calls ``sys.exit()``."""
