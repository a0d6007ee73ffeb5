# Sourced by ab.sh and plx.sh: one round of ps-local's digits run.
# ps_local_round DIR BUILD ROUND OUT PREFIX: DIR's ps-local at --epochs 300
# over each data path, its JSON summary in OUT/PREFIX-BUILD-PATH-rROUND.json.
ps_local_round() {
  local dir=$1 build=$2 round=$3 out=$4 prefix=$5 path
  for path in grpc shm; do
    "$dir/ps-local" --json --epochs 300 --data-path $path 2>/dev/null | tail -1 \
      > "$out/$prefix-$build-$path-r$round.json"
  done
}
