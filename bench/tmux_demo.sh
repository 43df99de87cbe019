#!/usr/bin/env bash
# `r3 demo` in a real terminal on a GPU node: tmux runs it at 100x30, the screen is captured
# while the live campaign grows, then keys jump to the best variant, open the plot and the
# archive, stop the campaign (shift+x) and quit.  Every capture goes to $OUT/tmux-demo.txt.
#
#   source .device/setup.sh && bash bench/tmux_demo.sh          (tmux on PATH, or in .tmuxkit/)
set -u
OUT=${OUT:-/tmp/r3-tmux-demo}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if ! command -v tmux >/dev/null && [ -x .tmuxkit/usr/bin/tmux ]; then
  export PATH=$PWD/.tmuxkit/usr/bin:$PATH
  export LD_LIBRARY_PATH=$PWD/.tmuxkit/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
log=$OUT/tmux-demo.txt
: >"$log"
session=r3demo
capture() {  # title
  { echo "=== $1 ($(date +%T))"; tmux capture-pane -p -t "$session"; } >>"$log"
}
export TERM=xterm-256color
tmux -f /dev/null new-session -d -s "$session" -x 100 -y 30 \
  "python3 -m r3tui demo --budget ${R3_DEMO_BUDGET:-8}; sleep 5"
for t in 20 40 60 80; do
  sleep 20
  capture "live, ${t}s"
done
tmux send-keys -t "$session" b; sleep 2; capture "b: jump to the best variant"
tmux send-keys -t "$session" 6; sleep 2; capture "6: convergence plot"
tmux send-keys -t "$session" 7; sleep 2; capture "7: MAP-Elites archive"
tmux send-keys -t "$session" X; sleep 8; capture "shift+x: stop the campaign"
tmux send-keys -t "$session" q; sleep 2
tmux kill-server 2>/dev/null
tail -n 70 "$log"
