"""Tests run offline: a connection to anything but this machine is refused at once
(instead of hanging on a network that CI does not have) and recorded, so that the
test that tried fails even when a library catches the error and falls back."""

import ipaddress
import socket

attempts: list = []


def _local(host) -> bool:
    if isinstance(host, bytes):
        host = host.decode()
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _refuse(what):
    attempts.append(what)
    raise ConnectionRefusedError(f"tests run offline: {what} refused")


def install() -> None:
    connect, connect_ex, getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo

    def checked(real):
        def call(sock, address):
            # AF_UNIX and friends: other processes of this machine (compile workers)
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
                _refuse(f"connection to {address}")
            return real(sock, address)

        return call

    def lookup(host, *args, **kwargs):
        if host is not None and not _local(host):
            _refuse(f"name lookup of {host!r}")
        return getaddrinfo(host, *args, **kwargs)

    socket.socket.connect, socket.socket.connect_ex = checked(connect), checked(connect_ex)
    socket.getaddrinfo = lookup
