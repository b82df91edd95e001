"""PNG curves of a run's log history (loss, learning rate, eval metrics)."""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SKIP = {"epoch", "step", "total_flos", "train_runtime", "train_samples_per_second", "train_steps_per_second"}


def plot_logs(log_history: list[dict], out_dir: str) -> list[str]:
    """One PNG per numeric metric that was logged at two or more steps."""
    series: dict[str, tuple[list, list]] = {}
    for entry in log_history:
        step = entry.get("step")
        for key, value in entry.items():
            if key in SKIP or step is None or not isinstance(value, (int, float)):
                continue
            xs, ys = series.setdefault(key, ([], []))
            xs.append(step)
            ys.append(value)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for key, (xs, ys) in series.items():
        if len(xs) < 2:
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3)
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
        path = os.path.join(out_dir, key.replace("/", "_") + ".png")
        fig.tight_layout()
        fig.savefig(path, dpi=80)
        plt.close(fig)
        written.append(path)
    return written
