"""``obleth demo``: a gateway in front of the simulated backend under multi-tenant load."""
