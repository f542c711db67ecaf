"""A campaign's results folder: its state file, its phases' records, its archive."""

from __future__ import annotations

import json
import os
import tarfile
import time
from pathlib import Path
from typing import List, Optional

from convbench.base.files import write_atomic


class Folder:
    """The campaign's result folder and what is done in it."""

    def __init__(self, root: os.PathLike):
        self.root = Path(root)
        for sub in ("cases", "logs", "identity"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    def state(self) -> dict:
        return self.read_json("state.json", {"phases": {}})

    def mark(self, phase: str, status: str, detail: str = "", seconds: float = 0.0) -> None:
        state = self.state()
        state["phases"][phase] = {"status": status, "detail": detail,
                                  "seconds": round(seconds, 1), "at": _now()}
        self.write_json("state.json", state)

    def done(self, phase: str) -> bool:
        return self.state()["phases"].get(phase, {}).get("status") in ("done", "not measured")

    def case_path(self, case: Case) -> Path:
        return self.root / "cases" / f"{case.id}.json"

    def log_path(self, case: Case) -> Path:
        return self.root / "logs" / f"{case.id}.log"

    def save(self, case: Case, record: dict, **more) -> None:
        record.update(id=case.id, case=case.to_json(), log=f"logs/{case.id}.log", **more)
        self.write_json(f"cases/{case.id}.json", record)

    def records(self) -> List[dict]:
        found = (_load(p) for p in sorted((self.root / "cases").glob("*.json")))
        return [r for r in found if r is not None]

    def write_json(self, name: str, data) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(data, indent=1, sort_keys=True, default=str) + "\n")

    def read_json(self, name: str, default=None):
        return _load(self.root / name, default)

    def archive(self, dest: Optional[os.PathLike]) -> None:
        """The folder as a .tar.gz at ``dest`` (written aside, then renamed)."""
        if not dest:
            return
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".part")
        with tarfile.open(tmp, "w:gz") as tar:
            tar.add(self.root, arcname=self.root.name)
        os.replace(tmp, dest)


def _load(path: Path, default=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


def _not_measured(why: str) -> dict:
    return {"status": "not measured", "detail": f"not measured: {why}"}
