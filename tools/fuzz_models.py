"""Long runs of the model-and-input fuzzer (tests/fuzz_models.py): random tiny architectures, rope scalings, position
limits, windows, vocabularies and dtypes, random padded batches and special tokens, every speculative path, each
case against plain greedy `generate()`.

    python tools/fuzz_models.py --cases-per-path 300 --seed 1 --out results.jsonl
    python tools/fuzz_models.py --cases-per-path 10000 --seed 7 --out long.jsonl --paths lookup,hybrid
    python tools/fuzz_models.py --rerun results.jsonl --out again.jsonl       # the failing cases of an earlier run
    python tools/fuzz_models.py --summary results.jsonl                        # failures grouped, refusals counted

One JSON line per case: the path, its seed (case `i` of path `p` in a run seeded `S` is "S:p:i", so any case is
drawn again by `tests.fuzz_models.draw_case(p, "S:p:i")`), a one-line description, the outcome ("same",
"refused: <Type>: <message>", "both refused: ...", "DIFFERENT: <first differing position, tokens>" or
"CRASH: <Type>: <message>\\n<traceback>"), whether it is a failure, where an error was raised, the generation
arguments used, the seconds the case took and the whole case as JSON. Paths are interleaved case by case, so an
interrupted run covers every path evenly; `--start` resumes; `--jobs` runs cases in several processes (lines are
written in case order).
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def failure_class(line: dict[str, Any]) -> str:
    """A failure's class: its kind, its exception type and message with numbers masked, and where it was raised."""
    outcome = line["outcome"].split("\n", 1)[0]
    if line["kind"] == "DIFFERENT":
        if "plain generate() raised" in outcome:
            return "DIFFERENT: plain raised, the path returned " + re.sub(r"\d+", "N", outcome.split("raised ")[1])[:80]
        target = line["case"]["target"]
        window = " with sliding_window=1" if target.get("window") == 1 else ""
        return f"DIFFERENT: {target['arch']} target{window}"
    text = re.sub(r"\d+", "N", outcome)[:160]
    return f"{text} @ {re.sub(r':[0-9]+$', '', line.get('origin', ''))}"


def summarise(lines: list[dict[str, Any]]) -> str:
    """Counts per path and kind, failures grouped by class (with one seed each), refusal messages counted."""
    out = []
    by_path: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        by_path[line["path"]][line["kind"]] += 1
        seconds[line["path"]] += line["seconds"]
    for path, kinds in sorted(by_path.items()):
        total = sum(kinds.values())
        out.append(f"{path}: {total} cases, {seconds[path] / max(total, 1):.2f} s/case, {dict(kinds)}")
    failures: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for line in lines:
        if line["failure"]:
            failures[failure_class(line)].append(line)
    out.append(f"\n{sum(len(v) for v in failures.values())} failures in {len(failures)} classes")
    for name, members in sorted(failures.items(), key=lambda item: -len(item[1])):
        paths = collections.Counter(m["path"] for m in members)
        archs = collections.Counter(m["case"]["target"]["arch"] for m in members)
        out.append(f"\n[{len(members)}] {name}\n    paths {dict(paths)}\n    targets {dict(archs)}")
        for m in members[:3]:
            out.append(f"    e.g. {m['path']} {m['seed']}: {m['description']}")
            out.append(f"         {m['outcome'].splitlines()[0][:300]}")
    refusals = collections.Counter(
        re.sub(r"\d+", "N", line["outcome"].split(": ", 2)[-1])[:110] + f" @ {line['origin'].split(':')[0]}"
        for line in lines
        if line["kind"] == "refused"
    )
    foreign = collections.Counter(
        f"{line['origin'].split(':')[0]}: " + re.sub(r"\d+", "N", line["outcome"].split(": ", 2)[-1])[:110]
        for line in lines
        if line["kind"] in ("refused", "both refused") and not line["origin"].startswith("hf_specdec")
    )
    out.append("\nrefusals raised outside hf_specdec (transformers' or torch's words, maybe misleading):")
    out.extend(f"    {n:5d}  {text}" for text, n in foreign.most_common())
    out.append("\nrefusals where plain generate() returned (message with numbers masked, where raised):")
    out.extend(f"    {n:5d}  {text}" for text, n in refusals.most_common())
    return "\n".join(out)


def _init_worker(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _run_one(item: tuple[str, str] | dict[str, Any]) -> dict[str, Any]:
    """One case (drawn from (path, seed), or rerun from its JSON), as its JSON line."""
    from tests.fuzz_models import Case, draw_case, record, run_case

    case = Case.from_json(item) if isinstance(item, dict) else draw_case(*item)
    return record(case, run_case(case))


def _write(lines: Any, sink: Any, counts: collections.Counter[str], quiet: bool) -> None:
    for line in lines:
        sink.write(json.dumps(line) + "\n")
        sink.flush()
        counts[line["kind"]] += 1
        if line["failure"] and not quiet:
            print(
                f"{line['path']} {line['seed']}: {line['outcome'].splitlines()[0][:240]}", file=sys.stderr, flush=True
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases-per-path", type=int, default=100)
    parser.add_argument("--seed", default="0", help="the run's seed: case i of path p is drawn from 'SEED:p:i'")
    parser.add_argument("--out", type=Path, help="the JSON lines file (appended to)")
    parser.add_argument("--paths", default=None, help="comma-separated subset of the paths (default: all)")
    parser.add_argument("--start", type=int, default=0, help="the first case index (resume, or split a run)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (tiny models: 1 is fastest)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (cases are independent)")
    parser.add_argument("--rerun", type=Path, help="rerun the failing cases of this JSON lines file")
    parser.add_argument("--summary", type=Path, help="summarise this JSON lines file and exit")
    parser.add_argument("--quiet", action="store_true", help="no line per failure on stderr")
    args = parser.parse_args(argv)

    if args.summary is not None:
        print(summarise([json.loads(line) for line in args.summary.read_text().splitlines() if line.strip()]))
        return 0
    if args.out is None:
        parser.error("--out is required (except with --summary)")

    import torch

    import hf_specdec
    from tests.fuzz_models import PATHS

    torch.set_num_threads(args.threads)
    print(f"hf_specdec from {Path(hf_specdec.__file__).parent}", flush=True)
    paths = PATHS if args.paths is None else tuple(args.paths.split(","))
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"unknown paths {unknown}; the paths are {', '.join(PATHS)}")

    work: list[tuple[str, str] | dict[str, Any]]  # (path, seed) to draw, or a case's JSON to rerun
    if args.rerun is not None:
        old = [json.loads(line) for line in args.rerun.read_text().splitlines() if line.strip()]
        work = [line["case"] for line in old if line["failure"]]
    else:
        work = [
            (path, f"{args.seed}:{path}:{i}")
            for i in range(args.start, args.start + args.cases_per_path)
            for path in paths
        ]

    counts: collections.Counter[str] = collections.Counter()
    started = time.perf_counter()
    with args.out.open("a") as sink:
        if args.jobs > 1:
            context = multiprocessing.get_context("fork")
            with context.Pool(args.jobs, initializer=_init_worker, initargs=(args.threads,)) as pool:
                lines = pool.imap(_run_one, work, chunksize=4)
                _write(lines, sink, counts, args.quiet)
        else:
            _write(map(_run_one, work), sink, counts, args.quiet)
    total = sum(counts.values())
    elapsed = time.perf_counter() - started
    print(f"{total} cases in {elapsed:.0f} s ({elapsed / max(total, 1):.2f} s/case): {dict(counts)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
