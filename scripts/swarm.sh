#!/usr/bin/env bash
# candle-ps as a Docker swarm stack (deploy/swarm/stack.yml), with no image registry.
#
#   scripts/swarm.sh up [--no-build] [--plan FILE]
#                                     images (as scripts/cluster.sh build), the certificates
#                                     and tokens (once), then `docker stack deploy`; with
#                                     --plan, the setup a plan file chose (`ps-scheduler plan
#                                     --out`): its servers, consistency, pipelining, backward
#                                     segments and wire dtype
#   scripts/swarm.sh status           the stack's tasks, and the job as the scheduler sees it
#   scripts/swarm.sh down             `docker stack rm`, then the stack's volumes
#
# The engine must be in a swarm: `docker swarm init` makes this machine a one-node
# swarm. PS_STACK names the stack (default candle-ps); PS_SWARM_SECRETS is where the
# certificates and tokens are written and read (default target/swarm/secrets);
# every setting of deploy/swarm/stack.yml (PS_WORKERS, PS_SERVERS, PS_EPOCHS, ...)
# is read from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."

STACK=${PS_STACK:-candle-ps}
export PS_SWARM_SECRETS=${PS_SWARM_SECRETS:-$PWD/target/swarm/secrets}
STACK_FILE=deploy/swarm/stack.yml

require_swarm() {
    local state
    state=$(docker info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null) || {
        echo "swarm.sh: no Docker engine answers" >&2
        exit 1
    }
    if [ "$state" != active ]; then
        echo "swarm.sh: this Docker engine is not in a swarm (state: $state); run \`docker swarm init\` to make this machine a one-node swarm, or join one" >&2
        exit 1
    fi
}

# Objects of this stack: containers, networks or volumes (the stack labels them all).
stack_objects() {
    docker "$1" ls -q ${2:+"$2"} --filter "label=com.docker.stack.namespace=$STACK"
}

# A CA, a node certificate and the servers' and workers' secrets, written once:
# a stack deployed again keeps them (swarm secrets cannot change under a service).
write_secrets() {
    if [ -f "$PS_SWARM_SECRETS/token" ]; then
        echo "==> secrets: kept those in $PS_SWARM_SECRETS"
        return
    fi
    echo "==> secrets: a CA, a node certificate and role tokens in $PS_SWARM_SECRETS"
    target/docker/bin/ps-scheduler certs --out "$PS_SWARM_SECRETS" --role-tokens
}

up() {
    require_swarm
    if [ -n "$(docker stack ls --format '{{.Name}}' | grep -Fx "$STACK")" ]; then
        echo "swarm.sh: stack $STACK is deployed already; \`scripts/swarm.sh down\` removes it (or set PS_STACK)" >&2
        exit 1
    fi
    local build=1 plan="" env name value
    while [ $# -gt 0 ]; do
        case "$1" in
            --no-build) build=0 && shift ;;
            --plan) plan=${2:?swarm.sh: --plan needs a plan file} && shift 2 ;;
            *) echo "swarm.sh: up takes --no-build and --plan FILE, not $1" >&2 && exit 2 ;;
        esac
    done
    if [ "$build" = 1 ]; then
        scripts/cluster.sh build
    fi
    if [ -n "$plan" ]; then
        # The variables of the plan's setup, as `ps-scheduler plan-env` prints
        # them; the stack file reads them.
        env=$(target/docker/bin/ps-scheduler plan-env "$plan") || exit
        echo "==> the plan's setup ($plan): ${env//$'\n'/ }"
        while IFS='=' read -r name value; do
            export "$name=$value"
        done <<<"$env"
    fi
    write_secrets
    echo "==> deploying stack $STACK (\`scripts/swarm.sh status\` follows it, \`scripts/swarm.sh down\` removes it)"
    # The images are local: no registry to resolve digests from, which is fine on
    # a one-node swarm (and on more nodes once every node holds the images).
    docker stack deploy --resolve-image never -c "$STACK_FILE" "$STACK"
}

status() {
    docker stack ps "$STACK" --format 'table {{.Name}}\t{{.CurrentState}}\t{{.Error}}'
    local scheduler
    scheduler=$(docker ps -q --filter "label=com.docker.swarm.service.name=${STACK}_scheduler" | head -n 1)
    if [ -n "$scheduler" ]; then
        docker exec "$scheduler" /ps-scheduler status --scheduler 127.0.0.1:7000
    else
        echo "(the scheduler is not running: the job is done, or has not started)"
    fi
}

# `docker stack rm` returns before the containers are gone, and a volume in use
# cannot be removed: waits for them first (at most a minute).
down() {
    docker stack rm "$STACK" >/dev/null 2>&1 || true
    local waited=0
    while [ -n "$(stack_objects container -a)" ] || [ -n "$(stack_objects network)" ]; do
        if [ "$waited" -ge 60 ]; then
            echo "swarm.sh: stack $STACK still has containers or networks after 60 s" >&2
            exit 1
        fi
        sleep 1
        waited=$((waited + 1))
    done
    local volumes
    volumes=$(stack_objects volume)
    if [ -n "$volumes" ]; then
        # shellcheck disable=SC2086 # one id per word
        docker volume rm $volumes >/dev/null
    fi
    echo "==> stack $STACK removed, with its volumes"
}

case "${1:-}" in
    up)
        shift
        up "$@"
        ;;
    status) status ;;
    down) down ;;
    *)
        sed -n '2,13p' "$0" >&2
        exit 2
        ;;
esac
