"""Best time so far against evaluations or wall time, with the original as a baseline.

A plotext plot where there is room, a one-line sparkline where the terminal is small (the
plot needs about 40×10 cells to say anything).  ``w`` switches the x axis.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.widgets import Sparkline, Static
from textual_plotext import PlotextPlot

from db.series import Convergence
from r3tui.ui.quantities import kernel_time, ratio, speedup

MIN_PLOT_WIDTH = 40
MIN_PLOT_HEIGHT = 10


def staircase(xs: list[float], ys: list[float], x_end: float) -> tuple[list[float], list[float]]:
    """Points of a step plot: the best time holds until the next improvement."""
    out_x: list[float] = []
    out_y: list[float] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        if i:
            out_x.append(x)
            out_y.append(ys[i - 1])
        out_x.append(x)
        out_y.append(y)
    if xs and x_end > xs[-1]:
        out_x.append(x_end)
        out_y.append(ys[-1])
    return out_x, out_y


def sampled_best(series: Convergence, width: int) -> list[float]:
    """Best time (µs) at ``width`` evenly spaced evaluations, for the sparkline."""
    if not series.points or width <= 0:
        return []
    total = max(series.n_evaluations, 1)
    out: list[float] = []
    i = 0
    points = series.points
    for k in range(1, width + 1):
        at = total * k / width
        while i + 1 < len(points) and points[i + 1].evaluation <= at:
            i += 1
        if points[0].evaluation <= at:
            # inverted so that the sparkline rises as the kernel gets faster
            out.append(points[0].best_s / points[i].best_s)
    return out


class ConvergencePanel(Vertical):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("w", "toggle_axis", "Evals/time")]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.series = Convergence()
        self.by_wall_time = False
        self.can_focus = True

    def compose(self) -> ComposeResult:
        yield Static(Text("no trials yet", style="dim"), id="convergence-caption")
        yield PlotextPlot(id="convergence-plot")
        yield Sparkline([], id="convergence-sparkline")

    def on_resize(self) -> None:
        self._draw()

    def show(self, series: Convergence) -> None:
        self.series = series
        self._draw()

    def action_toggle_axis(self) -> None:
        self.by_wall_time = not self.by_wall_time
        self._draw()

    def _draw(self) -> None:
        s = self.series
        caption = self.query_one("#convergence-caption", Static)
        plot = self.query_one("#convergence-plot", PlotextPlot)
        spark = self.query_one("#convergence-sparkline", Sparkline)
        small = self.size.width < MIN_PLOT_WIDTH or self.size.height < MIN_PLOT_HEIGHT
        plot.display = not small
        spark.display = small
        if not s.points:
            caption.update(Text(f"{s.n_evaluations} evaluations, none successful yet", style="dim"))
            plot.plt.clear_data()
            plot.refresh()
            spark.data = []
            return
        best = s.points[-1]
        caption.update(
            Text.assemble(
                ("best ", "bold"),
                f"{kernel_time(best.best_s)} ({speedup(ratio(s.original_s, best.best_s))}) "
                f"after {best.evaluation} of {s.n_evaluations} evaluations; "
                f"original {kernel_time(s.original_s)}",
            )
        )
        if small:
            spark.data = sampled_best(s, max(1, self.size.width))
            return
        plt = plot.plt
        plt.clear_data()
        plt.clear_figure()
        if self.by_wall_time and s.started_at is not None:
            xs = [(p.at - s.started_at).total_seconds() for p in s.points]
            end = (s.last_at - s.started_at).total_seconds() if s.last_at else xs[-1]
            plt.xlabel("wall time (s)")
        else:
            xs = [float(p.evaluation) for p in s.points]
            end = float(s.n_evaluations)
            plt.xlabel("evaluations")
        x, y = staircase(xs, [p.best_s * 1e6 for p in s.points], end)
        plt.plot(x, y, label="best so far", marker="braille")
        if s.original_s is not None:
            plt.plot([x[0], x[-1]], [s.original_s * 1e6] * 2, label="original", marker="dot")
        plt.ylabel("µs")
        plot.refresh()
