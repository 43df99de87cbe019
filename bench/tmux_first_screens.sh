#!/usr/bin/env bash
# The first screens a new user sees on a machine without a GPU (issue #20): `r3 demo --no-gpu`
# (the shipped demo database, opened from a copy) in a real terminal at 80x24 and at 120x36,
# NO_COLOR=1, captured by tmux: the campaign list, the first campaign opened (enter), its best
# variant (b) and the help (?).  Every capture goes to $OUT/tmux-first-screens.txt.
#
#   bash bench/tmux_first_screens.sh            (tmux on PATH; runs on the CPU machine)
#   R3_SIZES=100x30 bash bench/tmux_first_screens.sh   (the README's captures)
set -u
OUT=${OUT:-/tmp/r3-tmux-first}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
log=$OUT/tmux-first-screens.txt
: >"$log"
session=r3first
export TERM=xterm-256color NO_COLOR=1
r3=${R3:-python3 -m r3tui}
capture() {  # title
  { echo "=== $1"; tmux capture-pane -p -t "$session"; } >>"$log"
}
for size in ${R3_SIZES:-80x24 120x36}; do
  w=${size%x*}; h=${size#*x}
  tmux -f /dev/null new-session -d -s "$session" -x "$w" -y "$h" "$r3 demo --no-gpu; sleep 3"
  sleep "${R3_OPEN_WAIT:-8}"; capture "$size: r3 demo --no-gpu, first screen"
  tmux send-keys -t "$session" Enter; sleep 4; capture "$size: enter: the first campaign"
  tmux send-keys -t "$session" b; sleep 2; capture "$size: b: its best variant"
  tmux send-keys -t "$session" '?'; sleep 2; capture "$size: ?: help"
  tmux send-keys -t "$session" Escape; sleep 1
  tmux send-keys -t "$session" q; sleep 2
  tmux kill-session -t "$session" 2>/dev/null
done
cat "$log"
