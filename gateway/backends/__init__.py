"""Counter backends: where seats are counted and the fair queue lives."""
