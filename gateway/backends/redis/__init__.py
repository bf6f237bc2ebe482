"""Cluster mode: the counter backend that shares one budget between pods through Redis."""

from gateway.backends.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
