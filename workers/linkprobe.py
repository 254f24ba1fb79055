"""How fast two ranks talk: gloo send/recv between two processes, iperf-like.

Run as two processes (`python -m workers.linkprobe --rank 0|1 --master ADDR:PORT`), each where its
rank lives — two emulated nodes' namespaces for the inter-node link, one namespace twice for the
intra-node path. Rank 0 measures the round trip of a one-element message `PINGS` times a repeat
(the wire's latency: half the least of them; the path's α, what one step of a collective pays
beside its bytes: half their median) and the time to push `--megabytes` to rank 1 and hear its
one-element ack; the bandwidth (β) is the payload's bits over that time less the least round trip
(median over repeats, and the fastest of them as the path's peak). It prints one JSON line: what the pool's topology records as "measured"
(`link_figures`). Torch is imported only in the ranks (`main`), never by `probe`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from parallab.core.pools import LinkFigures

PINGS = 40
"""One-element round trips per repeat; the latency is half the least of them, α half their median."""


def _ranks(args: argparse.Namespace) -> dict[str, float] | None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://{args.master}", rank=args.rank, world_size=2, timeout=_td(args.timeout))
    one = torch.zeros(1)
    payload = torch.zeros(int(args.megabytes * 1e6) // 4)
    peer = 1 - args.rank
    rtts, tooks = [], []
    for _ in range(args.repeat):
        dist.barrier()
        if args.rank == 0:
            for _ in range(PINGS):
                t0 = time.perf_counter()
                dist.send(one, peer)
                dist.recv(one, peer)
                rtts.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            dist.send(payload, peer)
            dist.recv(one, peer)
            tooks.append(time.perf_counter() - t0)
        else:
            for _ in range(PINGS):
                dist.recv(one, peer)
                dist.send(one, peer)
            dist.recv(payload, peer)
            dist.send(one, peer)
    dist.destroy_process_group()
    if args.rank != 0:
        return None
    # The path's own round trip is the floor of the pings: a loaded host only ever adds to it (a
    # descheduled rank), so the median would measure the scheduler. The push pays one round trip
    # (its ack) on top of the bytes: the floor, not this repeat's ping, is taken off.
    rtt = min(rtts)
    rates = sorted(payload.numel() * 4 * 8 / max(took - rtt, 1e-9) for took in tooks)
    # Beside the floor, the median: what a round trip took on this host as loaded as it was (a
    # descheduled peer included). A ring step of a collective is such a one-way hand-over, so half
    # the median is the path's α, the per-step cost the planner's α–β model charges.
    median = sorted(rtts)[len(rtts) // 2]
    # The fastest push beside the median: a loaded host only ever slows a push, so the best of the
    # repeats is what says whether the path itself runs at its rate.
    return {
        "bandwidth_bps": rates[len(rates) // 2],
        "peak_bps": rates[-1],
        "latency_s": rtt / 2,
        "alpha_s": median / 2,
        "bytes": payload.numel() * 4,
    }


def _td(seconds: float):  # type: ignore[no-untyped-def]
    from datetime import timedelta

    return timedelta(seconds=seconds)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="workers.linkprobe")
    parser.add_argument("--rank", type=int, choices=(0, 1), required=True)
    parser.add_argument("--master", required=True, help="ADDR:PORT where rank 0 listens")
    parser.add_argument("--megabytes", type=float, default=16.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    said = _ranks(args)
    if said is not None:
        print(json.dumps(said), flush=True)


def link_figures(said: dict[str, float]) -> LinkFigures:
    """What the pool's topology records of one probed path: β, the wire's latency, and α."""
    return LinkFigures(bandwidth_bps=said["bandwidth_bps"], latency_s=said["latency_s"], alpha_s=said.get("alpha_s"))


def probe(
    prefix_a: list[str], prefix_b: list[str], master: str, *, megabytes: float = 16.0, repeat: int = 3, timeout_s: float = 120.0
) -> dict[str, float]:
    """Run the two ranks (rank 0 under `prefix_a`, e.g. `ip netns exec NS`, rank 1 under
    `prefix_b`) and return rank 0's measurement: bandwidth in bit/s, one-way latency in s."""
    root = str(Path(__file__).resolve().parent.parent)
    base = [sys.executable, "-m", "workers.linkprobe", "--master", master, "--megabytes", str(megabytes), "--repeat", str(repeat)]
    env = {"PYTHONPATH": root, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "eth0", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    procs = [
        subprocess.Popen([*prefix, *base, "--rank", str(rank)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for rank, prefix in ((0, prefix_a), (1, prefix_b))
    ]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError("link probe failed: " + " | ".join(err.strip().splitlines()[-1] if err.strip() else "" for _, err in outs))
    return dict(json.loads(outs[0][0].strip().splitlines()[-1]))


if __name__ == "__main__":
    main()
