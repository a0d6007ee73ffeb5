#!/bin/bash
# Profiles the ps-server and the worker during kv's 1 MiB pull throughput phase:
# prof-push.sh 4 s later.
exec "$(dirname "$0")/../mark-copy-stop55/prof-push.sh" "$1" "$2" 6.1
