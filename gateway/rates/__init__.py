"""Per-tenant rate budgets (``tenant_rpm``, ``tenant_tpm``): the token estimate a request
reserves (``estimate``), and where the budgets are kept (``budgets``: in this process, or
in Redis for a pool of pods, ``gateway.backends.redis.rates``)."""
