"""The manifest of each benchmarks/results/<device>/ folder: one entry per file
saying which script made it, with what command, at which commit, when, and on
what (jax version, device, CUDA driver); null where that is not known.

    python benchmarks/manifest.py           # add entries for unlisted files, drop those of missing ones
    python benchmarks/manifest.py --check   # exit 1 where files and entries disagree
    python benchmarks/manifest.py --take D  # the entries of D/manifest.json, for files copied from D

common.write_results() writes the entries of the files it writes, beside them
(a run with --out elsewhere, e.g. the GPU script's $LOGS, has its own
manifest.json: copy the files, not it, into results/<device>/, then --take).
A new log gets a bare entry from the first command (fill in what it lacks).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
NAME = "manifest.json"
FIELDS = ("file", "benchmark", "command", "commit", "date", "jax_version", "device", "driver")


def device_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200': the folder under benchmarks/results/."""
    slug = re.sub(r"[^a-z0-9]+", "_", name.lower().replace("nvidia", "")).strip("_")
    return slug or "gpu"


def load(folder: pathlib.Path) -> dict:
    path = folder / NAME
    return json.loads(path.read_text()) if path.exists() else {"files": []}


def save(folder: pathlib.Path, data: dict) -> None:
    data["files"].sort(key=lambda entry: entry["file"])
    (folder / NAME).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


def present(folder: pathlib.Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != NAME}


def folder_of(path: pathlib.Path) -> pathlib.Path:
    """results/<device>/ for a file anywhere below it, else the file's own folder."""
    path = path.resolve()
    if path.is_relative_to(RESULTS) and len(path.relative_to(RESULTS).parts) > 1:
        return RESULTS / path.relative_to(RESULTS).parts[0]
    return path.parent


def record(paths, fields: dict) -> None:
    """Write (or replace) the manifest entries of `paths` with `fields`."""
    for path in paths:
        folder = folder_of(pathlib.Path(path))
        data = load(folder)
        name = pathlib.Path(path).resolve().relative_to(folder.resolve()).as_posix()
        data["files"] = [e for e in data["files"] if e["file"] != name]
        data["files"].append({"file": name, **{k: fields.get(k) for k in FIELDS[1:]}})
        save(folder, data)


def take(run_dir: pathlib.Path) -> None:
    """The entries of a run's own manifest, into results/<its device>/ for the files copied there."""
    for entry in load(run_dir)["files"]:
        path = RESULTS / device_slug(entry.get("device") or "") / entry["file"]
        if path.exists():
            record([path], entry)


def bare_entry(folder: pathlib.Path, name: str) -> dict:
    """What a file nobody recorded says of itself (a JSON's device and versions)
    and git of it (the commit that added it, its date); null for the rest."""
    entry = dict.fromkeys(FIELDS, None) | {"file": name}
    try:
        data = json.loads((folder / name).read_text()) if name.endswith(".json") else {}
    except ValueError:
        data = {}
    if isinstance(data, dict):
        entry.update({k: data[k] for k in ("commit", "jax_version", "device", "driver") if k in data})
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%h %ad", "--date=short", "-1", "--", name],
        cwd=folder,
        capture_output=True,
        text=True,
    ).stdout.split()
    if added:
        entry["commit"] = entry["commit"] or added[0]
        entry["date"] = added[1]
    return entry


def problems(folder: pathlib.Path) -> list[str]:
    names = [e["file"] for e in load(folder)["files"]]
    files, twice = present(folder), {n for n in names if names.count(n) > 1}
    return (
        [f"{folder / n}: not in {NAME}" for n in sorted(files - set(names))]
        + [f"{folder / NAME}: {n} does not exist" for n in sorted(set(names) - files)]
        + [f"{folder / NAME}: {n} listed twice" for n in sorted(twice)]
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 on any mismatch")
    parser.add_argument(
        "--take",
        type=pathlib.Path,
        metavar="DIR",
        help="first take the entries of DIR/manifest.json (a run's --out folder)",
    )
    args = parser.parse_args(argv)
    if args.take:
        take(args.take)
    folders = sorted(p for p in RESULTS.iterdir() if p.is_dir())
    if not args.check:
        for folder in folders:
            data, files = load(folder), present(folder)
            known = {e["file"] for e in data["files"]}
            data["files"] = [e for e in data["files"] if e["file"] in files]
            data["files"] += [bare_entry(folder, n) for n in sorted(files - known)]
            save(folder, data)
    errors = [line for folder in folders for line in problems(folder)]
    print("\n".join(errors) or f"{len(folders)} manifest(s) match their folders")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
