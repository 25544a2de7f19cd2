#!/usr/bin/env python3
"""A small OTLP trace receiver for agentloop's tests: OTLP/HTTP (protobuf and JSON) on one port and
OTLP/gRPC on another, both on 127.0.0.1. Every span received is written to OUT as one JSON line:

  {"transport": "http/protobuf" | "http/json" | "grpc", "trace_id": hex, "span_id": hex,
   "parent_span_id": hex or "", "name": ..., "kind": int, "start_ns": int, "end_ns": int,
   "status": {"code": int, "message": str}, "attributes": {key: value},
   "resource": {key: value}, "scope": name,
   "events": [{"name": ..., "time_ns": int, "attributes": {key: value}}]}

Ids are written as hex whatever the transport (OTLP/JSON carries them as hex; protobuf as bytes).
Prints "ready HTTP_PORT GRPC_PORT" on stdout once both listen; stops on SIGTERM or stdin's end.

Usage: receiver.py OUT
"""
import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

LOCK = threading.Lock()


def value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def write(out, request, transport):
    lines = []
    for rs in request.resource_spans:
        resource = {kv.key: value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                lines.append(json.dumps({
                    "transport": transport,
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "start_ns": s.start_time_unix_nano,
                    "end_ns": s.end_time_unix_nano,
                    "status": {"code": s.status.code, "message": s.status.message},
                    "attributes": {kv.key: value(kv.value) for kv in s.attributes},
                    "resource": resource,
                    "scope": ss.scope.name,
                    "events": [
                        {
                            "name": e.name,
                            "time_ns": e.time_unix_nano,
                            "attributes": {kv.key: value(kv.value) for kv in e.attributes},
                        }
                        for e in s.events
                    ],
                }))
    with LOCK:
        with open(out, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(line + "\n")


def http_handler(out):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = trace_service_pb2.ExportTraceServiceRequest()
            if self.headers.get("Content-Type", "").startswith("application/json"):
                json_format.Parse(body, request)
                transport = "http/json"
                reply = b"{}"
                content_type = "application/json"
            else:
                request.ParseFromString(body)
                transport = "http/protobuf"
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                content_type = "application/x-protobuf"
            write(out, request, transport)
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    return Handler


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out

    def Export(self, request, context):
        write(self.out, request, "grpc")
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    out = sys.argv[1]
    http = ThreadingHTTPServer(("127.0.0.1", 0), http_handler(out))
    threading.Thread(target=http.serve_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(out), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"ready {http.server_address[1]} {grpc_port}", flush=True)
    # The test closes stdin (or kills the process) when it is done.
    sys.stdin.read()
    server.stop(0)
    http.shutdown()


if __name__ == "__main__":
    main()
