// Preloaded into a Node MCP server (NODE_OPTIONS=--require) so that it listens on 127.0.0.1 only:
// server-everything's streamable HTTP transport calls listen(PORT) and would bind every
// interface. The address it got is written to stderr as "agentloop-listening HOST PORT", so that
// a test can start it on port 0 and still find it.
const net = require("net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (args[0] !== null && typeof args[0] === "object") {
    args[0] = { ...args[0], host: "127.0.0.1" };
  } else if (typeof args[0] === "number" || /^\d+$/.test(String(args[0]))) {
    const callbacks = args.slice(1).filter((a) => typeof a === "function");
    args = [Number(args[0]), "127.0.0.1", ...callbacks];
  }
  this.once("listening", () => {
    const a = this.address();
    process.stderr.write(`agentloop-listening ${a.address} ${a.port}\n`);
  });
  return listen.apply(this, args);
};
