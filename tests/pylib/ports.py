"""Free TCP ports for the test clusters (daemons, routers) on 127.0.0.1."""
import random
import socket

_PORTS_GIVEN = set()


def free_port():
    """A port that is free now, taken below the kernel's ephemeral range
    (net.ipv4.ip_local_port_range, 32768.. by default): a port the kernel
    handed out for bind(0) is free only until the next process connects
    somewhere, since outgoing connections (UCX tcp, gRPC clients) draw their
    local ports from that same range."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    hi = max(low - 1, 2048)
    for _ in range(200):
        port = random.randint(max(1024, hi - 12000), hi)
        if port in _PORTS_GIVEN:
            continue
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", port))
            _PORTS_GIVEN.add(port)
            return port
        except OSError:
            continue
        finally:
            s.close()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port

