#!/bin/bash
for i in $(seq 1 1200); do ns=$(ip netns list | awk '{print $1}' | grep -- '-switch$' | head -1); [ -n "$ns" ] && break; sleep 0.05; done
ip netns exec $ns python3 "$(dirname "$0")"/sample_in.py $1 $2
