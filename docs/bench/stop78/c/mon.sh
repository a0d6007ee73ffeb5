#!/bin/bash
# every 3 s: plain and streaming writer
for i in $(seq ${1:-60}); do echo "$(date +%T) $(timeout 20 ./ring3 0 0 300 0) | $(timeout 20 ./ring3 0 0 300 1)"; sleep 3; done
