"""A stdio MCP server of the official Python SDK 1.9 (legacy-requirements.txt): one tool, `add`."""

from mcp.server.fastmcp import FastMCP

mcp = FastMCP("legacy")


@mcp.tool()
def add(a: int, b: int) -> int:
    """Adds two numbers."""
    return a + b


if __name__ == "__main__":
    mcp.run()
