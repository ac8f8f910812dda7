"""The listening socket that several server processes share (``conductor serve --workers N``, and the load
benchmark), made so that their accepted connections get TCP_NODELAY."""

import socket

from conductor.errors import ConfigError


def listening_socket(host: str, port: int) -> socket.socket:
    """The TCP socket the ``--workers`` processes share, made as asyncio makes its own (``getaddrinfo``'s protocol,
    so accepted connections get TCP_NODELAY). uvicorn's ``--workers`` binds one with protocol 0, which leaves Nagle's
    algorithm on: about 40 ms more per keep-alive request on Linux (Kludex/uvicorn#3149)."""
    sock = None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        if sock is not None:
            sock.close()
        raise ConfigError(f"can't listen on {host}:{port}: {exc.strerror}") from exc
    sock.set_inheritable(True)
    return sock
