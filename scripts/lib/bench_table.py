#!/usr/bin/env python3
"""Turn Google Benchmark JSON output into a markdown table, and keep BENCHMARKS.md current.

  bench_table.py RESULT.json                      print the table
  bench_table.py --update BENCHMARKS.md --name N --command CMD RESULT.json
                                                  replace the text between
                                                  <!-- bench:N:begin --> and <!-- bench:N:end -->
                                                  (appended when absent); the rest is kept as is.
  --ratio-to B (repeatable) adds a column "÷ B": each row's bytes/s (or items/s) divided by that
  of benchmark B with the same arguments (e.g. chain_fused/2 ÷ triad/2), both from this one run.
  bench_table.py --update BENCHMARKS.md --name N --text FILE   sets section N to FILE's markdown.
"""
import argparse
import datetime
import json
import os
import re
import sys

# Fields of a benchmark entry that are not user counters.
STANDARD = {
    "name", "family_index", "per_family_instance_index", "run_name", "run_type", "repetitions",
    "repetition_index", "threads", "iterations", "real_time", "cpu_time", "time_unit",
    "aggregate_name", "aggregate_unit", "error_occurred", "error_message", "label",
    "big_o", "rms", "complexity_n",
}
RATE_ORDER = ["bytes_per_second", "items_per_second"]
HEADINGS = {"bytes_per_second": "bytes/s", "items_per_second": "items/s"}


def si(value, binary=False):
    step, units = (1024.0, ["", "Ki", "Mi", "Gi", "Ti", "Pi"]) if binary else \
        (1000.0, ["", "k", "M", "G", "T", "P"])
    for unit in units:
        if abs(value) < step or unit == units[-1]:
            return f"{value:.3g}{unit}"
        value /= step


def fmt_counter(key, value):
    if not isinstance(value, (int, float)):
        return str(value)
    if key == "bytes_per_second":
        return si(value, binary=True) + "B/s"
    if key == "items_per_second":
        return si(value) + "/s"
    return f"{value:.4g}" if abs(value) < 1e6 else si(value)


def rate(row):
    for key in RATE_ORDER:
        if key in row:
            return row[key]
    return None


def family_and_args(name):
    family, _, args = name.partition("/")
    return family, args


def repeated(rows):
    """The rows to show, and each one's coefficient of variation of real time ({} without repetitions).

    With repetitions (scripts/bench runs 5: this host is shared and its speed moves by a third within
    minutes), each benchmark's median, under the benchmark's own name, so that names stay comparable
    from run to run; a run that kept the single repetitions shows the aggregates as they are."""
    aggregates = [r for r in rows if r.get("run_type") == "aggregate"]
    if not aggregates:
        return rows, {}
    medians = [dict(r, name=r["run_name"]) for r in aggregates if r.get("aggregate_name") == "median"]
    # Interleaved repetitions report in the order they finished: back to the binary's own order.
    medians.sort(key=lambda r: (r.get("family_index", 0), r.get("per_family_instance_index", 0)))
    if not medians:
        return aggregates, {}
    return medians, {r["run_name"]: r["real_time"] for r in aggregates if r.get("aggregate_name") == "cv"}


def repetitions(data):
    return max((r.get("repetitions", 1) for r in data.get("benchmarks", [])
                if r.get("run_type") == "aggregate"), default=1)


def table(data, ratio_to=()):
    rows, spread = repeated(data.get("benchmarks", []))
    counters = []
    for r in rows:
        for k in r:
            if k not in STANDARD and k not in counters:
                counters.append(k)
    counters.sort(key=lambda k: RATE_ORDER.index(k) if k in RATE_ORDER else len(RATE_ORDER))

    by_name = {family_and_args(r["name"]): r for r in rows}
    head = ["benchmark", "real time", "cpu time"] + [HEADINGS.get(k, k) for k in counters] + \
        (["cv"] if spread else []) + [f"÷ {b}" for b in ratio_to]
    lines = ["| " + " | ".join(head) + " |",
             "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for r in rows:
        name = r["name"].replace("|", "\\|")
        if r.get("error_occurred"):
            cells = [f"error: {r.get('error_message', '')}"] + [""] * (len(head) - 2)
        else:
            unit = r.get("time_unit", "ns")
            if r.get("aggregate_unit") == "percentage":  # e.g. the cv aggregate
                cells = [f"{r['real_time'] * 100:.2f}%", f"{r['cpu_time'] * 100:.2f}%"]
            else:
                cells = [f"{r['real_time']:.4g} {unit}", f"{r['cpu_time']:.4g} {unit}"]
            cells += [fmt_counter(k, r[k]) if k in r else "" for k in counters]
            if spread:
                cv = spread.get(r["name"])
                cells.append(f"{cv * 100:.1f}%" if cv is not None else "")
            for b in ratio_to:
                base = by_name.get((b, family_and_args(r["name"])[1]))
                ok = base is not None and rate(base) and rate(r) is not None
                cells.append(f"{rate(r) / rate(base):.2f}×" if ok else "")
        lines.append("| " + " | ".join([f"`{name}`"] + cells) + " |")
    return "\n".join(lines)


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def section(name, command, data, ratio_to=()):
    ctx = data.get("context", {})
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    return "\n".join([
        f"<!-- bench:{name}:begin -->",
        f"### {name}",
        "",
        f"- date: {when}",
        f"- command: `{command}`",
        f"- CPU: {cpu_model()} ({ctx.get('num_cpus', '?')} logical CPUs)",
    ] + ([f"- medians of {repetitions(data)} repetitions; cv: their real times' coefficient of variation"]
         if repetitions(data) > 1 else []) + [
        "",
        table(data, ratio_to),
        f"<!-- bench:{name}:end -->",
    ])


def update(path, name, new):
    text = open(path).read() if os.path.exists(path) else \
        "# Benchmarks\n\nSections between `bench:` markers are rewritten by `scripts/bench`.\n"
    begin, end = f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: new, text, count=1)
    elif begin in text or end in text:
        sys.exit(f"{path}: unbalanced markers for {name}; fix by hand")
    else:
        text = text.rstrip("\n") + "\n\n" + new + "\n"
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("json", nargs="?")
    ap.add_argument("--update", metavar="MARKDOWN")
    ap.add_argument("--name")
    ap.add_argument("--command", default="")
    ap.add_argument("--ratio-to", action="append", default=[])
    ap.add_argument("--text", metavar="FILE")
    args = ap.parse_args()
    if args.text:
        if not (args.update and args.name):
            ap.error("--text needs --update and --name")
        with open(args.text) as f:
            body = f.read().strip("\n")
        update(args.update, args.name,
               f"<!-- bench:{args.name}:begin -->\n{body}\n<!-- bench:{args.name}:end -->")
        return
    if not args.json:
        ap.error("a RESULT.json is needed")
    with open(args.json) as f:
        data = json.load(f)
    if not args.update:
        print(table(data, args.ratio_to))
        return
    if not args.name:
        ap.error("--update needs --name")
    update(args.update, args.name, section(args.name, args.command, data, args.ratio_to))


if __name__ == "__main__":
    main()
