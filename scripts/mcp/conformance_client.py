# The MCP conformance suite's client under test: agentloop's own MCP client, through the
# `agentloop` command, as an agent file's `[[mcp]]` entry uses it (no `protocol_version`: the
# client negotiates, so the suite's version is reached by negotiation, not pinned).
# Usage: conformance_client.py AGENTLOOP URL (the suite appends URL and names the scenario in
# MCP_CONFORMANCE_SCENARIO, the version it speaks in MCP_CONFORMANCE_PROTOCOL_VERSION, and the
# calls it wants in MCP_CONFORMANCE_CONTEXT's `toolCalls`). It writes an agent file whose one MCP
# server is URL, lists its tools (`agentloop mcp list --json`; a negotiated version other than the
# suite's fails here, before any call), and, where the scenario wants calls, runs a scripted agent
# that makes them (`agentloop run --json`): the context's calls, else `tools_call` adds two
# numbers, `sse-retry` calls the tool whose stream the suite cuts,
# `json-schema-2020-12-preservation` echoes the schema agentloop listed, and
# `http-invalid-tool-headers` calls every tool agentloop listed (a tool it should have refused
# would be called, and fail the scenario). Exits as the last command did. Used by
# crates/agentloop-cli/tests/mcp_conformance.rs.
import json, os, subprocess, sys, tempfile


def agentloop_run(*args):
    done = subprocess.run([agentloop, *args], capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    print(done.stdout)
    return done


def example(schema):
    """A value of a property's schema, for a call the scenario does not spell out."""
    kind = schema.get("type")
    return {"string": "x", "integer": 1, "number": 1.5, "boolean": True, "object": {}, "array": [], "null": None}.get(kind, "x")


def calls_for(scenario, tools, context):
    if context.get("toolCalls"):
        # A null argument is left out, as a model leaves out what it has no value for (the
        # suite accepts either; agentloop refuses a null its schema does not allow).
        return [(c["name"], {k: v for k, v in (c.get("arguments") or {}).items() if v is not None})
                for c in context["toolCalls"]]
    if scenario == "http-invalid-tool-headers":
        return [(name, {k: example(v) for k, v in t["input_schema"].get("properties", {}).items()})
                for name, t in tools.items()]
    if scenario == "tools_call":
        return [("add_numbers", {"a": 5, "b": 3})]
    if scenario == "sse-retry":
        return [("test_reconnection", {})]
    if scenario == "json-schema-2020-12-preservation":
        return [("json_schema_echo", {"schema": tools["json_schema_2020_12_tool"]["input_schema"]})]
    return []


agentloop, url = sys.argv[1], sys.argv[-1]
scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
wire = os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION", "")
context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
with tempfile.TemporaryDirectory(prefix="agentloop-conformance-") as work:
    agent = os.path.join(work, "agent.toml")
    script = os.path.join(work, "script.json")
    with open(agent, "w") as f:
        f.write(f"""name = "conformance-client"
[model]
provider = "scripted"
script = "script.json"

[[mcp]]
name = "server"
url = {json.dumps(url)}
prefix = ""
""")
    # Listing needs no model, but the file names its script: an empty one until the calls are known.
    with open(script, "w") as f:
        f.write("[]")
    listed = agentloop_run("mcp", "list", "--json", agent)
    if listed.returncode != 0:
        sys.exit(listed.returncode)
    servers = json.loads(listed.stdout)["servers"]
    spoken = servers[0].get("protocol_version")
    if wire and spoken != wire:
        sys.exit(f"agentloop negotiated MCP {spoken}, the suite speaks {wire}")
    tools = {t["name"]: t for s in servers for t in s["tools"]}
    calls = calls_for(scenario, tools, context)
    if not calls:
        sys.exit(0)
    with open(script, "w") as f:
        json.dump([
            {"tool_calls": [{"id": f"c{i}", "name": n, "arguments": a} for i, (n, a) in enumerate(calls)]},
            {"text": "done"},
        ], f)
    sys.exit(agentloop_run("run", "--json", "--input", "Call the tools.", agent).returncode)
