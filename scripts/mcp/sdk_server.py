# A stdio MCP server of agentloop's own tests, made with the official Python SDK (`mcp`, pinned in
# requirements.txt), which speaks 2026-07-28 and the older wires, so that agentloop's client is
# tried at each on the same server. `add_tool` adds `new_tool` and announces that the tool list
# changed before it answers (on the `subscriptions/listen` streams a 2026-07-28 client opened, and
# as `notifications/tools/list_changed` to an older one); `new_tool` writes `new_tool.ran` in its
# working directory; `steps` reports progress 1, 2 and 3 of 3 under the request's token, then
# answers; `picture` answers a 1x1 PNG; `fail` raises (an `isError` result the SDK words as
# "Error executing tool fail"); `sleep` sleeps
# `secs` seconds and, cancelled first, writes `sleep.cancelled`. Used by agentloop-mcp's tests.
import base64
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGP4z8DwHwAFAAH/iZk9HQAAAABJRU5ErkJggg=="

server = MCPServer("sdk")


def new_tool() -> str:
    """Runs."""
    Path("new_tool.ran").write_text("yes")
    return "new_tool ran"


@server.tool()
async def add_tool(ctx: Context) -> str:
    """Adds new_tool."""
    if "new_tool" not in [t.name for t in await server.list_tools()]:
        server.add_tool(new_tool)
        await ctx.notify_tools_changed()
        await ctx.session.send_tool_list_changed()
    return "added new_tool"


@server.tool()
async def steps(ctx: Context) -> str:
    """Reports progress three times, then answers."""
    for step in (1, 2, 3):
        await ctx.report_progress(step, 3, f"step {step}")
        await anyio.sleep(0.05)
    return "three steps done"


@server.tool()
def picture() -> Image:
    """Answers a 1x1 PNG."""
    return Image(data=base64.b64decode(PNG), format="png")


@server.tool()
def fail() -> str:
    """Always fails."""
    raise ValueError("this tool always fails")


@server.tool()
async def sleep(secs: float) -> str:
    """Sleeps, unless cancelled."""
    try:
        await anyio.sleep(secs)
    except anyio.get_cancelled_exc_class():
        Path("sleep.cancelled").write_text("yes")
        raise
    return "slept"


server.run("stdio")
