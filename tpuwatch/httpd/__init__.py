"""A small HTTP/1.1 server that hostile or slow clients cannot lock out.

One event-loop thread accepts, does TLS handshakes, reads request heads and
writes responses, all non-blocking and each under a deadline; complete
requests go to small bounded worker pools.  See docs/endpoint.md.
"""
