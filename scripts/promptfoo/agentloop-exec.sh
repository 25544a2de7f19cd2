#!/bin/sh
# agentloop as a promptfoo provider, through promptfoo's exec provider. In promptfooconfig.yaml:
#   providers:
#     - id: "exec: scripts/promptfoo/agentloop-exec.sh path/to/agent.toml"
# promptfoo then runs `agentloop-exec.sh AGENT_FILE PROMPT OPTIONS_JSON CONTEXT_JSON` for each
# test, and reads stdout as the answer: the run's final output (`agentloop run --quiet`). A run
# that does not finish exits non-zero, which promptfoo records as the test's error. $AGENTLOOP
# names the agentloop command (default: agentloop on PATH).
set -eu
if [ "$#" -lt 2 ]; then
  echo "usage: agentloop-exec.sh AGENT_FILE PROMPT [OPTIONS_JSON CONTEXT_JSON]" >&2
  exit 2
fi
exec "${AGENTLOOP:-agentloop}" run "$1" --quiet --input "$2"
