"""A test trainer for two replicas on different machines: the master listens on its TF_CONFIG
port, the worker connects to the master's TF_CONFIG address, and they exchange one line each.
Every replica prints which node it runs on (AIPTRAIN_NODE_HOSTNAME when the backend sets it),
and the message it received.

  --connect-seconds  how long the worker keeps retrying while the master's name and port appear
"""

import argparse
import json
import os
import socket
import sys
import time


def node_name() -> str:
    return os.environ.get("AIPTRAIN_NODE_HOSTNAME") or "unknown"


def serve(address: str, me: str) -> str:
    port = int(address.rsplit(":", 1)[1])
    with socket.create_server(("", port)) as server:
        connection, _ = server.accept()
        with connection, connection.makefile("rw") as stream:
            received = stream.readline().strip()
            stream.write(f"hello from {me} on {node_name()}\n")
            stream.flush()
            stream.readline()  # until the worker hangs up: it has printed its line by then
    return received


def call(address: str, me: str, connect_seconds: float) -> str:
    host, port = address.rsplit(":", 1)
    deadline = time.monotonic() + connect_seconds
    while True:
        try:
            connection = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:  # the name or the listener is not there yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    with connection, connection.makefile("rw") as stream:
        stream.write(f"hello from {me} on {node_name()}\n")
        stream.flush()
        received = stream.readline().strip()
        # Printed before hanging up: once the master exits, the worker may be stopped.
        print(f"{me} received: {received}", flush=True)
    return received


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--connect-seconds", type=float, default=120.0)
    parser.add_argument("--job-dir")  # accepted (aiptrain appends it when given), unused
    args = parser.parse_args()

    tf_config = json.loads(os.environ["TF_CONFIG"])
    task = tf_config["task"]
    me = f"{task['type']}-{task['index']}"
    cluster = tf_config["cluster"]
    master_address = (cluster.get("chief") or cluster["master"])[0]
    print(f"{me} runs on node {node_name()} as {socket.gethostname()}", flush=True)
    if task["type"] in ("master", "chief"):
        received = serve(master_address, me)
        print(f"{me} received: {received}", flush=True)
    else:
        received = call(master_address, me, args.connect_seconds)
    sys.exit(0 if received.startswith("hello from ") else 1)


if __name__ == "__main__":
    main()
