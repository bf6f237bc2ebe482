"""Decisions without I/O: the fair queue, admission verdicts, permits, weight parsing.

Nothing in this package reads the clock, sleeps, or touches the network; the drivers
(scheduler, backends, middleware) pass time in and do the I/O. A test keeps it that way.
"""
