"""A client generated from proto/ps/v1 by another gRPC implementation (Python grpcio)
drives a real ps-server process: optimizer arithmetic, exactly-once pushes, every
bad input with its status and the state unchanged, chunked streams, pushes and
pulls on the session stream, and embedding rows (declare, push, pull).

Run: python interop/python/test_interop.py  (PS_SERVER_BIN names the binary;
default target/debug/ps-server).
"""

import os
import struct
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import grpc
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[2]
GENERATED = Path(tempfile.mkdtemp(prefix="ps-interop-"))


def generate_stubs():
    args = ["grpc_tools.protoc", f"-I{ROOT / 'proto'}", f"--python_out={GENERATED}",
            f"--grpc_python_out={GENERATED}", str(ROOT / "proto/ps/v1/ps.proto")]
    if protoc.main(args) != 0:
        sys.exit("protoc failed to compile proto/ps/v1/ps.proto")
    sys.path.insert(0, str(GENERATED))


generate_stubs()
from ps.v1 import ps_pb2 as pb  # noqa: E402
from ps.v1 import ps_pb2_grpc as pb_grpc  # noqa: E402

F32 = pb.DTYPE_F32


def f32(values):
    return struct.pack(f"<{len(values)}f", *values)


def floats(data):
    return list(struct.unpack(f"<{len(data) // 4}f", data))


def as_f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


class Server:
    """A ps-server child process on a free loopback port."""

    def __init__(self, *args):
        binary = os.environ.get("PS_SERVER_BIN", str(ROOT / "target/debug/ps-server"))
        env = dict(os.environ, RUST_LOG="info", NO_COLOR="1")
        self.process = subprocess.Popen([binary, "--listen", "127.0.0.1:0", *args],
                                        stderr=subprocess.PIPE, text=True, env=env)
        for line in self.process.stderr:
            if "ps-server listening" in line:
                self.addr = line.split("addr=")[1].split()[0]
                break
        else:
            raise RuntimeError("ps-server exited before listening")
        self.channel = grpc.insecure_channel(self.addr)
        self.stub = pb_grpc.ParameterServerStub(self.channel)

    def stop(self):
        self.channel.close()
        self.process.terminate()
        assert self.process.wait(timeout=30) == 0, "ps-server did not exit cleanly on SIGTERM"
        self.process.stderr.close()


def spec(name, n, optimizer, dtype=F32):
    return pb.ParameterSpec(name=name, dtype=dtype, shape=[n], optimizer=optimizer)


def sgd(lr):
    return pb.Optimizer(sgd=pb.Sgd(lr=lr))


def tensor(name, values, dtype=F32, shape=None, data=None):
    return pb.Tensor(name=name, dtype=dtype, shape=shape if shape is not None else [len(values)],
                     data=data if data is not None else f32(values))


class InteropTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server("--workers", "2")
        cls.stub = cls.server.stub

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def register(self, name, values, optimizer):
        init = pb.ParameterInit(spec=spec(name, len(values), optimizer), initial=f32(values))
        return self.stub.Register(pb.RegisterRequest(params=[init]))

    def state(self, name):
        response = self.stub.Pull(pb.PullRequest(keys=[pb.KeyRef(name=name)]))
        pulled = response.tensors[0]
        return floats(pulled.tensor.data), pulled.version

    def assert_refused(self, call, request, code, needle, key):
        before = self.state(key)
        with self.assertRaises(grpc.RpcError) as caught:
            call(request)
        self.assertEqual(caught.exception.code(), code, caught.exception.details())
        self.assertIn(needle, caught.exception.details())
        self.assertEqual(self.state(key), before, "a refused request changed the state")

    def test_momentum_arithmetic_under_bsp(self):
        w0 = [1.0, -2.0, 0.5]
        mom = pb.Optimizer(momentum=pb.Momentum(lr=0.1, momentum=0.9))
        self.assertTrue(self.register("mom", w0, mom).keys[0].created)
        grads = [([0.5, 1.0, -1.0], [1.5, -1.0, 0.0]), ([1.0, 1.0, 1.0], [0.0, 0.0, 2.0])]
        w, buf = list(w0), [0.0] * 3
        for step, (g0, g1) in enumerate(grads):
            self.stub.Push(pb.PushRequest(worker_id=0, step=step, grads=[tensor("mom", g0)]))
            self.stub.Push(pb.PushRequest(worker_id=1, step=step, grads=[tensor("mom", g1)]))
            for i in range(3):
                g = (as_f32(g0[i]) + as_f32(g1[i])) / 2
                buf[i] = 0.9 * buf[i] + g
                w[i] = w[i] - 0.1 * buf[i]
        pulled = self.stub.Pull(pb.PullRequest(keys=[pb.KeyRef(name="mom")], min_version=2, timeout_ms=5000))
        self.assertEqual(pulled.tensors[0].version, 2)
        for got, want in zip(floats(pulled.tensors[0].tensor.data), w):
            self.assertLessEqual(abs(got - want), 1e-6 * abs(want), (got, want))

    def test_repeated_push_is_applied_once(self):
        self.register("once", [1.0], sgd(1.0))
        request = pb.PushRequest(worker_id=0, step=0, grads=[tensor("once", [0.5])])
        self.assertTrue(self.stub.Push(request).keys[0].accepted)
        self.assertFalse(self.stub.Push(request).keys[0].accepted)
        self.stub.Push(pb.PushRequest(worker_id=1, step=0, grads=[tensor("once", [0.5])]))
        self.assertFalse(self.stub.Push(request).keys[0].accepted)
        self.assertEqual(self.state("once"), ([0.5], 1))

    def test_bad_inputs_get_precise_statuses_and_change_nothing(self):
        self.register("bad", [1.0, 2.0], sgd(0.1))
        push = lambda *grads, worker=0, step=0: pb.PushRequest(worker_id=worker, step=step, grads=list(grads))
        code = grpc.StatusCode
        cases = [
            (push(tensor("missing", [1.0])), code.NOT_FOUND, "missing"),
            (push(tensor("bad", [1.0, 1.0], dtype=pb.DTYPE_BF16, data=b"\0" * 4)), code.INVALID_ARGUMENT, "bf16"),
            (push(tensor("bad", [1.0, 1.0, 1.0])), code.INVALID_ARGUMENT, "shape"),
            (push(tensor("bad", [1.0, 1.0], data=b"\0" * 7)), code.INVALID_ARGUMENT, "needs 8 bytes"),
            (push(tensor("bad", [float("nan"), 1.0])), code.INVALID_ARGUMENT, "non-finite"),
            (push(tensor("bad", [1.0, float("inf")])), code.INVALID_ARGUMENT, "non-finite"),
            (push(tensor("bad", [1.0, 1.0]), step=7), code.FAILED_PRECONDITION, "from the future"),
            (push(), code.INVALID_ARGUMENT, "empty request"),
            (push(tensor("bad", [1.0, 1.0]), worker=5), code.INVALID_ARGUMENT, "outside"),
        ]
        for request, status, needle in cases:
            with self.subTest(needle=needle):
                self.assert_refused(self.stub.Push, request, status, needle, "bad")
        oversized = push(tensor("bad", [1.0, 1.0], shape=[2], data=b"\0" * (5 << 20)))
        self.assert_refused(self.stub.Push, oversized, code.OUT_OF_RANGE, "too large", "bad")
        self.assert_refused(self.stub.Pull, pb.PullRequest(), code.INVALID_ARGUMENT, "no keys", "bad")
        self.assert_refused(self.stub.Register, pb.RegisterRequest(), code.INVALID_ARGUMENT, "no parameters", "bad")
        conflict = pb.RegisterRequest(params=[pb.ParameterInit(spec=spec("bad", 2, sgd(0.5)))])
        self.assert_refused(self.stub.Register, conflict, code.ALREADY_EXISTS, "lr=0.5", "bad")

    def test_malformed_chunk_streams_change_nothing(self):
        self.register("chunks", [0.0] * 4, sgd(1.0))

        def chunk(offset, values):
            return pb.PushChunk(worker_id=0, step=0, chunk=pb.TensorChunk(
                name="chunks", dtype=F32, shape=[4], offset=offset, data=f32(values)))

        streams = [
            ([chunk(0, [1.0, 1.0])], "ended after 8 of 16 bytes"),
            ([chunk(0, [1.0, 1.0]), chunk(4, [1.0, 1.0, 1.0])], "overlaps"),
            ([chunk(0, [1.0, 1.0]), chunk(8, [1.0, 1.0, 1.0])], "runs past"),
            ([chunk(0, [1.0]), chunk(8, [1.0])], "gap"),
        ]
        for messages, needle in streams:
            with self.subTest(needle=needle):
                self.assert_refused(lambda m: self.stub.PushStream(iter(m)), messages,
                                    grpc.StatusCode.INVALID_ARGUMENT, needle, "chunks")

    def test_large_tensor_round_trips_through_streams(self):
        n = (16 << 20) // 4
        data = f32([float(i % 65536) - 32768.0 for i in range(n)])
        step = 2 << 20
        chunks = (pb.RegisterChunk(spec=spec("large", n, sgd(0.1)), offset=o, data=data[o:o + step])
                  for o in range(0, len(data), step))
        self.assertTrue(self.stub.RegisterStream(chunks).keys[0].created)
        received = bytearray()
        for message in self.stub.PullStream(pb.PullRequest(keys=[pb.KeyRef(name="large")])):
            self.assertEqual(message.chunk.offset, len(received))
            self.assertLess(len(message.chunk.data), 4 << 20)
            received += message.chunk.data
        self.assertTrue(bytes(received) == data, "streamed values differ")

    def test_session_stream_pushes_and_pulls_as_unary_calls_do(self):
        self.register("sess", [1.0, 2.0], sgd(1.0))
        push = lambda worker: pb.PushRequest(worker_id=worker, step=0, grads=[tensor("sess", [0.5, 1.0])])
        pull = pb.PullRequest(keys=[pb.KeyRef(name="sess")], min_version=1, timeout_ms=5000)
        requests = [pb.SessionRequest(id=10, pull=pull),
                    pb.SessionRequest(id=11, push=push(0)),
                    pb.SessionRequest(id=12, push=push(1))]
        answers = {answer.id: answer for answer in self.stub.Session(iter(requests))}
        self.assertEqual(sorted(answers), [10, 11, 12])
        self.assertTrue(answers[11].push.keys[0].accepted and answers[12].push.keys[0].accepted)
        pulled = answers[10].pull.tensors[0]
        self.assertEqual((floats(pulled.tensor.data), pulled.version), ([0.5, 1.0], 1))
        self.assertEqual(self.state("sess"), ([0.5, 1.0], 1))
        refused = list(self.stub.Session(iter([pb.SessionRequest(id=1, push=push(0))])))[0]
        self.assertFalse(refused.push.keys[0].accepted, "a repeated push is applied once")
        missing = list(self.stub.Session(iter([pb.SessionRequest(
            id=2, pull=pb.PullRequest(keys=[pb.KeyRef(name="nothing")]))])))[0]
        self.assertEqual(missing.refusal.code, grpc.StatusCode.NOT_FOUND.value[0])

    def test_embedding_rows_adagrad_under_bsp_and_bad_rows_refused(self):
        table = pb.TableSpec(name="py-emb", width=2, dtype=F32, max_rows=100, buckets=1,
                             optimizer=pb.RowOptimizer(adagrad=pb.Adagrad(lr=0.1, initial_accumulator=0.1)))
        declared = self.stub.DeclareTable(pb.DeclareTableRequest(table=table, buckets=[0]))
        self.assertTrue(declared.buckets[0].created)
        ids = lambda values: struct.pack(f"<{len(values)}Q", *values)
        block = lambda keys, rows=b"": pb.RowBlock(bucket=0, ids=ids(keys), rows=rows)
        push = lambda worker, keys, grads: pb.PushRowsRequest(
            table="py-emb", worker_id=worker, step=0, blocks=[block(keys, f32(grads))])
        self.assertTrue(self.stub.PushRows(push(0, [3, 7], [1.0, -2.0, 0.5, 0.5])).buckets[0].accepted)
        self.assertFalse(self.stub.PushRows(push(0, [3, 7], [1.0, -2.0, 0.5, 0.5])).buckets[0].accepted)
        self.stub.PushRows(push(1, [7], [1.5, -0.5]))
        pull = pb.PullRowsRequest(table="py-emb", blocks=[block([3, 7, 50])], min_version=1, timeout_ms=5000)
        pulled = self.stub.PullRows(pull)
        self.assertEqual(pulled.blocks[0].version, 1)
        # Each row's gradient is the workers' sum over the 2 workers (a worker
        # that missed a row adds zero), then Adagrad from an accumulator of 0.1.
        sums = {3: [1.0, -2.0], 7: [0.5 + 1.5, 0.5 - 0.5], 50: [0.0, 0.0]}
        want = []
        for key in (3, 7, 50):
            for g in sums[key]:
                g = g / 2
                want.append(0.0 - 0.1 * g / ((0.1 + g * g) ** 0.5 + 1e-10) if key != 50 else 0.0)
        for got, expected in zip(floats(pulled.rows), want):
            self.assertLessEqual(abs(got - expected), 1e-6, (got, expected))
        state = lambda: self.stub.PullRows(pb.PullRowsRequest(table="py-emb", blocks=[block([3, 7])]))
        before = state()
        bad = [(push(0, [9, 9], [1.0] * 4), grpc.StatusCode.INVALID_ARGUMENT, "appears twice"),
               (push(0, [100], [1.0, 1.0]), grpc.StatusCode.INVALID_ARGUMENT, "out of range"),
               (push(0, [3], [1.0]), grpc.StatusCode.INVALID_ARGUMENT, "gradient elements"),
               (push(0, [3], [float("nan"), 1.0]), grpc.StatusCode.INVALID_ARGUMENT, "non-finite"),
               (pb.PushRowsRequest(table="nope", blocks=[block([3], f32([1.0, 1.0]))]),
                grpc.StatusCode.NOT_FOUND, "unknown table")]
        for request, code, needle in bad:
            with self.assertRaises(grpc.RpcError) as caught:
                self.stub.PushRows(request)
            self.assertEqual(caught.exception.code(), code, caught.exception.details())
            self.assertIn(needle, caught.exception.details())
        self.assertEqual(state(), before, "a refused row push changed the rows")

    def test_session_row_operations_answer_as_unary_calls_do(self):
        # 334 rows of 64 floats: the answer's rows (85 KiB) are sent as a
        # piece of their own, after the answer's other fields, and the
        # message must decode as any protobuf message does.
        table = pb.TableSpec(name="py-session-emb", width=64, dtype=F32, max_rows=1000, buckets=1,
                             init=pb.RowInit(uniform=pb.RowUniform(low=-1.0, high=1.0), seed=5),
                             optimizer=pb.RowOptimizer(sgd=pb.Sgd(lr=1.0)))
        self.stub.DeclareTable(pb.DeclareTableRequest(table=table, buckets=[0]))
        keys = list(range(0, 1000, 3))
        block = pb.RowBlock(bucket=0, ids=struct.pack(f"<{len(keys)}Q", *keys))
        pull = pb.PullRowsRequest(table="py-session-emb", blocks=[block])
        unary = self.stub.PullRows(pull)
        answers = list(self.stub.Session(iter([pb.SessionRequest(id=5, pull_rows=pull)])))
        self.assertEqual([a.id for a in answers], [5])
        self.assertEqual(answers[0].pull_rows, unary)
        self.assertEqual(len(unary.rows), len(keys) * 64 * 4)
        self.assertTrue(any(v != 0.0 for v in floats(unary.rows)), "initialised rows")

    def test_stats_count_what_was_served(self):
        stats = self.stub.Stats(pb.StatsRequest())
        self.assertEqual(stats.consistency, "bsp")
        self.assertEqual(stats.workers, 2)
        self.assertGreaterEqual(stats.pushes, 1)


if __name__ == "__main__":
    outcome = unittest.main(verbosity=2, exit=False).result
    failed = len(outcome.failures) + len(outcome.errors) + len(outcome.unexpectedSuccesses)
    print(f"interop: {outcome.testsRun - failed - len(outcome.skipped)} passed, {failed} failed")
    sys.exit(1 if failed or outcome.testsRun == 0 else 0)
