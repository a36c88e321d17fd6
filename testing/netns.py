"""Real network partitions: each node in a network namespace of its own, a veth pair
between every two nodes, and the links cut, cut one way, made lossy and healed.

    node a's namespace                     node b's namespace
    198.18.K.2 --- peer1 ====== peer0 --- 198.18.K.6
        |                                      |
      client                                 client
        |                                      |
    198.18.K.1 (this namespace)            198.18.K.5 (this namespace)

A node's one address is on its `client` link to this namespace (a /30 of 198.18.0.0/15,
the range set aside for network tests), so that clients here reach it whatever happens
between the nodes; the nodes reach each other by a /32 route over their own veth pair,
never through this namespace. Run a node with `prefix(node) + command`.

Links between nodes fail by their egress queues (`tc`): `pfifo limit 0` drops everything
(a cut, one way per side), an `htb` whose classic-BPF filter sends a random share of the
packets to such a queue drops that share (loss). Both only need iproute2 and the kernel's
sch_htb, sch_pfifo and cls_bpf, where netem (sch_netem) may be missing.

Names carry this process's id and a counter (namespaces `nautilus-PID-N-NODE`), so
parallel runs do not collide; `remove()` deletes every namespace (and with it every link
and queue), and `create()` first removes what a run that died left behind. Not root, or
`ip`/`tc` missing, or a kernel without what is needed: `Missing`, with the reason.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import subprocess
import zlib
from collections.abc import Iterable
from typing import Self

from testing.lifecycle import Missing

NAMESPACE_PREFIX = "nautilus-"
STALE_NAMESPACE = re.compile(rf"^{NAMESPACE_PREFIX}(\d+)-\d+-\S+")
SUBNETS = 512  # the /24s of 198.18.0.0/15 (RFC 2544)
CLIENT_DEVICE = "client"  # in each node's namespace; its pair's other end is here
DROPPED = re.compile(r"\(dropped (\d+),")  # in `tc -s qdisc show`
DROP_ALL = ("pfifo", "limit", "0")  # a queue of no room: every packet is dropped
RANDOM_WORD = 2**32 - 0x1000 + 56  # SKF_AD_OFF + SKF_AD_RANDOM (linux/filter.h), unsigned
PASS_CLASS, DROP_CLASS = 0x10001, 0x10002  # htb classes 1:1 and 1:2
_networks = itertools.count()


class NetworkError(Exception):
    """An `ip` or `tc` command failed; the message quotes it and its error."""


def run(*command: str) -> str:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NetworkError(f"{' '.join(command)}: {result.stderr.strip()}")
    return result.stdout


def require_tools() -> None:
    """Missing unless this process is root and has `ip` and `tc`."""
    if os.geteuid() != 0:
        raise Missing("network namespaces need root (run the partition tests as root)")
    if shutil.which("ip") is None or shutil.which("tc") is None:
        raise Missing("ip and tc are not installed (apt-get install iproute2)")


def remove_stale_namespaces() -> None:
    """Deletes the namespaces of runs whose process is gone (killed before cleaning up)."""
    for line in run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        if (match := STALE_NAMESPACE.match(name)) and not _alive(int(match[1])):
            with contextlib.suppress(NetworkError):
                run("ip", "netns", "delete", name)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # root may signal any process: only a missing one fails
    except ProcessLookupError:
        return False
    return True


def loss_program(percent: float) -> str:
    """A classic BPF classifier, in tc's `bytecode` form (`COUNT,code jt jf k,...`),
    that sends `percent` of the packets at random to DROP_CLASS, the others to
    PASS_CLASS (netem does this, where the kernel has it)."""
    threshold = round(percent / 100 * 2**32)
    instructions = [
        (0x20, 0, 0, RANDOM_WORD),  # ld rand: A = a random 32-bit word
        (0x35, 0, 1, threshold),  # jge #threshold: on if A >= threshold, else skip one
        (0x06, 0, 0, PASS_CLASS),  # ret
        (0x06, 0, 0, DROP_CLASS),  # ret
    ]
    return "".join([f"{len(instructions)},", *(f"{c} {t} {f} {k}," for c, t, f, k in instructions)])


class Network:
    """Nodes `names` in namespaces of their own, every two joined by a veth pair."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = list(names)
        assert 0 < len(self.names) < 64, "a /24 holds 63 nodes' /30s"
        self._serial = next(_networks)
        self._tag = f"{os.getpid()}-{self._serial}"
        self.subnet = self._free_subnet(os.getpid() * 64 + self._serial)
        self._created: list[str] = []  # namespaces, removed by remove()

    # ------------------------------------------------------------------ names

    def namespace(self, node: str) -> str:
        return f"{NAMESPACE_PREFIX}{self._tag}-{node}"

    def address(self, node: str) -> str:
        """The node's address: clients and other nodes reach it there."""
        return f"{self.subnet}.{4 * self.names.index(node) + 2}"

    def prefix(self, node: str) -> list[str]:
        """What runs a command inside the node's namespace."""
        return ["ip", "netns", "exec", self.namespace(node)]

    def _here(self, node: str) -> str:
        """This namespace's end of the node's client link."""
        return f"{self.subnet}.{4 * self.names.index(node) + 1}"

    def _client_link(self, node: str) -> str:
        """The name of this namespace's end of the node's client link (15 bytes at most)."""
        return f"nt{os.getpid():x}-{self._serial}-{self.names.index(node)}"

    def _device(self, node: str, peer: str) -> str:
        """In `node`'s namespace, its end of the pair to `peer`."""
        return f"peer{self.names.index(peer)}"

    # ------------------------------------------------------------------ building

    def create(self) -> Self:
        """Makes the namespaces and links (remove() undoes even a half-made network)."""
        require_tools()
        remove_stale_namespaces()
        try:
            for node in self.names:
                self._add_node(node)
            for node, peer in itertools.combinations(self.names, 2):
                self._add_pair(node, peer)
            self._check_queues()
        except NetworkError as exc:
            self.remove()
            raise Missing(f"cannot build test networks here: {exc}") from None
        return self

    def _add_node(self, node: str) -> None:
        namespace = self.namespace(node)
        run("ip", "netns", "add", namespace)
        self._created.append(namespace)
        run("ip", "-n", namespace, "link", "set", "lo", "up")
        here = self._client_link(node)
        run(
            *("ip", "link", "add", here, "type", "veth"),
            *("peer", "name", CLIENT_DEVICE, "netns", namespace),
        )
        run("ip", "addr", "add", f"{self._here(node)}/30", "dev", here)
        run("ip", "link", "set", here, "up")
        run("ip", "-n", namespace, "addr", "add", f"{self.address(node)}/30", "dev", CLIENT_DEVICE)
        run("ip", "-n", namespace, "link", "set", CLIENT_DEVICE, "up")

    def _add_pair(self, node: str, peer: str) -> None:
        run(
            *("ip", "link", "add", self._device(node, peer), "netns", self.namespace(node)),
            *("type", "veth", "peer", "name", self._device(peer, node)),
            *("netns", self.namespace(peer)),
        )
        for one, other in ((node, peer), (peer, node)):
            namespace, device = self.namespace(one), self._device(one, other)
            run("ip", "-n", namespace, "link", "set", device, "up")
            run(
                *("ip", "-n", namespace, "route", "add", f"{self.address(other)}/32"),
                *("dev", device, "src", self.address(one)),
            )

    def _check_queues(self) -> None:
        """Makes and removes a lossy queue, so that a kernel without htb or cls_bpf is
        found here (Missing) rather than in the middle of a test."""
        if len(self.names) > 1:
            first, second = self.names[:2]
            self._lossy(first, second, 50)
            self._clear(first, second)

    def _free_subnet(self, seed: int) -> str:
        """A /24 of 198.18.0.0/15 that no address here is in (another run's)."""
        taken = run("ip", "-4", "-o", "addr", "show") if shutil.which("ip") else ""
        start = zlib.crc32(str(seed).encode())
        for offset in range(SUBNETS):
            index = (start + offset) % SUBNETS
            subnet = f"198.{18 + index // 256}.{index % 256}"
            if f" {subnet}." not in taken:
                return subnet
        raise Missing("every /24 of 198.18.0.0/15 is in use here")

    # ------------------------------------------------------------------ failures

    def cut(self, node: str, peer: str) -> None:
        """Nothing passes between the two, either way (silently, as a dead switch)."""
        self.cut_one_way(node, peer)
        self.cut_one_way(peer, node)

    def cut_one_way(self, sender: str, receiver: str) -> None:
        """`sender`'s packets to `receiver` are dropped; the other way they pass."""
        self._clear(sender, receiver)
        self._tc(sender, receiver, "qdisc", "add", "root", *DROP_ALL)

    def lose(self, node: str, peer: str, percent: float) -> None:
        """`percent` of the packets between the two are dropped, each way, at random."""
        assert 0 < percent < 100, "cut() drops them all"
        for one, other in ((node, peer), (peer, node)):
            self._clear(one, other)
            self._lossy(one, other, percent)

    def heal(self) -> None:
        """Every link passes everything again."""
        for node, peer in itertools.permutations(self.names, 2):
            self._clear(node, peer)

    def dropped(self, sender: str, receiver: str) -> int:
        """How many of `sender`'s packets to `receiver` were dropped so far (by its
        current queues: heal() starts again from 0)."""
        namespace, device = self.namespace(sender), self._device(sender, receiver)
        stats = run("tc", "-s", "-n", namespace, "qdisc", "show", "dev", device)
        return sum(int(count) for count in DROPPED.findall(stats))

    def _lossy(self, sender: str, receiver: str, percent: float) -> None:
        self._tc(sender, receiver, "qdisc", "add", "root", "handle", "1:", "htb", "default", "1")
        rate = ("htb", "rate", "10gbit", "quantum", "60000")  # no limit in a test
        for klass in ("1:1", "1:2"):
            self._tc(sender, receiver, "class", "add", "parent", "1:", "classid", klass, *rate)
        self._tc(sender, receiver, "qdisc", "add", "parent", "1:2", *DROP_ALL)
        self._tc(
            sender,
            receiver,
            "filter",
            "add",
            "parent",
            "1:",
            "bpf",
            "bytecode",
            loss_program(percent),
        )

    def _clear(self, sender: str, receiver: str) -> None:
        """Back to the link's default queue (none set: nothing to do)."""
        with contextlib.suppress(NetworkError):
            self._tc(sender, receiver, "qdisc", "del", "root")

    def _tc(self, sender: str, receiver: str, kind: str, verb: str, *spec: str) -> None:
        """`tc KIND VERB dev DEVICE SPEC...` on `sender`'s end of the pair to `receiver`."""
        device = self._device(sender, receiver)
        run("tc", "-n", self.namespace(sender), kind, verb, "dev", device, *spec)

    # ------------------------------------------------------------------ cleanup

    def remove(self) -> None:
        """Deletes every namespace made; their links and queues go with them (a veth
        pair is deleted with either end, the client links' ends here too)."""
        while self._created:
            with contextlib.suppress(NetworkError):
                run("ip", "netns", "delete", self._created.pop())

    def __enter__(self) -> Self:
        return self.create()

    def __exit__(self, *exc_info: object) -> None:
        self.remove()
