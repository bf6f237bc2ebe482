"""A small Django project behind the gateway, served over ASGI or WSGI.

Run it from the repository's root (``pip install -e . django`` first), over ASGI:

    OBLETH_GLOBAL_MAX_IN_FLIGHT=2 OBLETH_OVERFLOW_POLICY=reject \\
    uvicorn examples.django_project.asgi:application

or over WSGI, under gunicorn's threaded workers:

    OBLETH_GLOBAL_MAX_IN_FLIGHT=2 OBLETH_OVERFLOW_POLICY=reject \\
    gunicorn --worker-class gthread --threads 8 examples.django_project.wsgi:application

``asgi.py`` wraps Django's ASGI handler in ``GatewayMiddleware``, ``wsgi.py`` its WSGI
handler in ``WSGIGatewayMiddleware``: the gateway sits in front of Django, not in
Django's ``MIDDLEWARE`` setting, so a request is admitted before Django spends anything on
it. The views (``views.py``) are the same for both. With the limit at 2 and the ``reject``
policy, a third request while two answers are being written gets 503 with
``Retry-After``; ``GET /stats`` tells how many requests Django served at once.
"""
