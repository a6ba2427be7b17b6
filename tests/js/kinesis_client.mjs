// The AWS SDK for JavaScript v3 (@aws-sdk/client-kinesis) against an SMS Kinesis endpoint,
// driven by tests/integration/test_kinesis_js.py:
//
//   node kinesis_client.mjs COMMAND < request.json        (put, get, create, register)
//   node kinesis_client.mjs subscribe 'REQUEST-JSON'       (stdin stays open: closing it stops)
//
// The answer is JSON on stdout: one object, or for `subscribe` one object a line, each
// written as its event arrives. Record data goes both ways as base64. Environment:
// KINESIS_ENDPOINT (https://host:port), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
// (default us-east-1), NODE_EXTRA_CA_CERTS (the cluster's CA: node reads it at start, so the
// SDK's TLS trusts the endpoint's certificate).
//
// Commands:
//   create    {StreamName, ShardCount}  -> {StreamStatus}
//             (CreateStream, then the SDK's waitUntilStreamExists)
//   put       {StreamName, Records: [{PartitionKey, Data, ExplicitHashKey?}]}
//             -> {Records: [{ShardId, SequenceNumber} | {ErrorCode, ErrorMessage}], FailedRecordCount}
//             (PutRecords, in batches of at most 500)
//   get       {StreamName, ShardIds: [...], Limit?}
//             -> {Shards: {ShardId: [{SequenceNumber, PartitionKey, Data, ApproximateArrivalTimestamp}]}}
//             (per shard: GetShardIterator TRIM_HORIZON, then GetRecords until a page is empty)
//   register  {StreamName, ConsumerName} -> {StreamARN, ConsumerARN, ConsumerStatus}
//             (DescribeStreamSummary, RegisterStreamConsumer)
//   subscribe {ConsumerARN, ShardId, StartingPosition?, Count?, TimeoutMs?}
//             -> {"event": "started", http}         once the SDK's send() has resolved
//                {"event": "records", Records, ContinuationSequenceNumber, MillisBehindLatest}
//                                                   for each SubscribeToShardEvent
//                {"event": "end", reason, received, http}
//             (SubscribeToShard; it ends when Count records have come, at TimeoutMs (default
//             60 s), when stdin closes, or on SIGTERM; exit 0. An error: {"event": "error", ...}, exit 1)
//
// Every answer has `http`: the SDK's request handler (the Kinesis client's default is a
// NodeHttp2Handler, HTTP/2 for every operation) and each HTTP/2 session it opened, with the
// protocol TLS negotiated by ALPN ("h2").

import http2 from "node:http2";
import {
  CreateStreamCommand,
  DescribeStreamSummaryCommand,
  GetRecordsCommand,
  GetShardIteratorCommand,
  KinesisClient,
  PutRecordsCommand,
  RegisterStreamConsumerCommand,
  SubscribeToShardCommand,
  waitUntilStreamExists,
} from "@aws-sdk/client-kinesis";

// --- which HTTP the SDK speaks: every HTTP/2 session it opens, with its ALPN protocol --------
// (the SDK's NodeHttp2Handler calls http2.connect on this same module object)
const sessions = [];
const connect = http2.connect;
http2.connect = function (authority, ...rest) {
  const session = connect.call(this, authority, ...rest);
  const seen = { authority: String(authority), alpnProtocol: null, encrypted: null };
  sessions.push(seen);
  session.once("connect", () => {
    seen.alpnProtocol = session.alpnProtocol ?? null;
    seen.encrypted = session.encrypted ?? null;
  });
  return session;
};

let client = null;

function http() {
  const handler = client?.config?.requestHandler;
  return {
    handler: handler?.constructor?.name ?? null,
    handlerProtocol: handler?.metadata?.handlerProtocol ?? null,
    sessions,
  };
}

function print(value) {
  // (stdout is a pipe: node writes to pipes synchronously on Linux, so a line is out as it is printed)
  process.stdout.write(JSON.stringify(value) + "\n");
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString("utf8").trim();
  return text ? JSON.parse(text) : {};
}

function makeClient() {
  const endpoint = process.env.KINESIS_ENDPOINT;
  if (!endpoint) throw new Error("KINESIS_ENDPOINT is not set");
  return new KinesisClient({
    endpoint,
    region: process.env.AWS_REGION || "us-east-1",
    credentials: {
      accessKeyId: process.env.AWS_ACCESS_KEY_ID,
      secretAccessKey: process.env.AWS_SECRET_ACCESS_KEY,
    },
    maxAttempts: 2,
    // (no requestHandler given: the Kinesis client's default, a NodeHttp2Handler with
    // disableConcurrentStreams, one HTTP/2 connection per request, as users run it)
  });
}

function recordOut(r) {
  return {
    SequenceNumber: r.SequenceNumber,
    PartitionKey: r.PartitionKey,
    Data: Buffer.from(r.Data ?? []).toString("base64"),
    ApproximateArrivalTimestamp: r.ApproximateArrivalTimestamp ? r.ApproximateArrivalTimestamp.getTime() : null,
  };
}

async function create(request) {
  await client.send(new CreateStreamCommand({ StreamName: request.StreamName, ShardCount: request.ShardCount }));
  await waitUntilStreamExists({ client, minDelay: 1, maxDelay: 2, maxWaitTime: 60 },
                              { StreamName: request.StreamName });
  const summary = (await client.send(new DescribeStreamSummaryCommand({ StreamName: request.StreamName })))
    .StreamDescriptionSummary;
  return { StreamStatus: summary.StreamStatus, OpenShardCount: summary.OpenShardCount };
}

async function put(request) {
  const records = request.Records.map((r) => {
    const entry = { PartitionKey: r.PartitionKey, Data: Buffer.from(r.Data, "base64") };
    if (r.ExplicitHashKey !== undefined) entry.ExplicitHashKey = r.ExplicitHashKey;
    return entry;
  });
  const out = [];
  let failed = 0;
  for (let start = 0; start < records.length; start += 500) {
    const answer = await client.send(
      new PutRecordsCommand({ StreamName: request.StreamName, Records: records.slice(start, start + 500) }));
    failed += answer.FailedRecordCount ?? 0;
    for (const r of answer.Records) {
      out.push(r.ErrorCode ? { ErrorCode: r.ErrorCode, ErrorMessage: r.ErrorMessage }
                           : { ShardId: r.ShardId, SequenceNumber: r.SequenceNumber });
    }
  }
  return { Records: out, FailedRecordCount: failed };
}

async function get(request) {
  const shards = {};
  for (const shardId of request.ShardIds) {
    let iterator = (await client.send(new GetShardIteratorCommand({
      StreamName: request.StreamName, ShardId: shardId, ShardIteratorType: "TRIM_HORIZON",
    }))).ShardIterator;
    const records = [];
    for (let calls = 0; iterator; calls++) {
      if (calls >= 1000) throw new Error(`GetRecords of ${shardId}: not caught up after 1000 calls`);
      const page = await client.send(
        new GetRecordsCommand({ ShardIterator: iterator, Limit: request.Limit ?? undefined }));
      records.push(...page.Records.map(recordOut));
      iterator = page.Records.length ? page.NextShardIterator : undefined;
    }
    shards[shardId] = records;
  }
  return { Shards: shards };
}

async function register(request) {
  const summary = (await client.send(new DescribeStreamSummaryCommand({ StreamName: request.StreamName })))
    .StreamDescriptionSummary;
  const consumer = (await client.send(new RegisterStreamConsumerCommand({
    StreamARN: summary.StreamARN, ConsumerName: request.ConsumerName,
  }))).Consumer;
  return { StreamARN: summary.StreamARN, ConsumerARN: consumer.ConsumerARN, ConsumerStatus: consumer.ConsumerStatus };
}

async function subscribe(request) {
  const abort = new AbortController();
  let reason = null;
  const stop = (why) => {
    if (!reason) reason = why;
    abort.abort();
  };
  const onTerm = () => stop("SIGTERM");
  process.once("SIGTERM", onTerm);
  process.stdin.once("end", () => stop("stdin closed")).resume();   // the test closes stdin: stop
  const timer = setTimeout(() => stop("timeout"), request.TimeoutMs ?? 60_000);
  const want = request.Count ?? Infinity;
  let received = 0;
  let eventStream = null;
  // An abort while waiting for the next event: the SDK's iterator may not notice it until
  // the next event comes (the stream is quiet between heartbeats), so end the wait here.
  const aborted = new Promise((resolve) => abort.signal.addEventListener("abort", () => resolve(null), { once: true }));
  try {
    const position = { ...(request.StartingPosition ?? { Type: "LATEST" }) };
    if (position.Timestamp !== undefined) position.Timestamp = new Date(position.Timestamp);
    const answer = await client.send(new SubscribeToShardCommand({
      ConsumerARN: request.ConsumerARN, ShardId: request.ShardId, StartingPosition: position,
    }), { abortSignal: abort.signal });
    print({ event: "started", http: http() });
    eventStream = answer.EventStream[Symbol.asyncIterator]();
    while (!reason) {
      const next = await Promise.race([eventStream.next(), aborted]);
      if (next === null) break;                    // stopped
      if (next.done) {
        reason = "stream ended";
        break;
      }
      const event = next.value;
      if (!event.SubscribeToShardEvent) {
        const [kind, body] = Object.entries(event)[0] ?? ["unknown", {}];
        throw Object.assign(new Error(`event stream exception ${kind}: ${body?.message ?? JSON.stringify(body)}`),
                            { name: kind });
      }
      const e = event.SubscribeToShardEvent;
      received += e.Records.length;
      print({
        event: "records", Records: e.Records.map(recordOut),
        ContinuationSequenceNumber: e.ContinuationSequenceNumber, MillisBehindLatest: e.MillisBehindLatest,
      });
      if (received >= want) reason = "count";
    }
  } catch (error) {
    if (!reason) throw error;  // (an abort we asked for is how a stop looks from inside the SDK)
  } finally {
    clearTimeout(timer);
    process.removeListener("SIGTERM", onTerm);
    if (eventStream) eventStream.return?.().catch(() => {});   // (closes the HTTP/2 stream: RST_STREAM)
  }
  print({ event: "end", reason, received, http: http() });
  return null;
}

const COMMANDS = { create, put, get, register, subscribe };

async function main() {
  const command = process.argv[2];
  if (!COMMANDS[command]) {
    process.stderr.write(`usage: node kinesis_client.mjs ${Object.keys(COMMANDS).join("|")} < request.json\n`);
    return 2;
  }
  try {
    // `subscribe` takes its request from argv (its stdin stays open: closing it stops the subscription)
    const request = command === "subscribe" ? JSON.parse(process.argv[3] ?? "{}") : await readStdin();
    client = makeClient();
    const answer = await COMMANDS[command](request);
    if (answer !== null) print({ ...answer, http: http() });
    return 0;
  } catch (error) {
    print({ event: "error", name: error.name, message: error.message,
            status: error.$metadata?.httpStatusCode ?? null, http: http() });
    process.stderr.write(`${error.stack ?? error}\n`);
    return 1;
  } finally {
    client?.destroy();
    process.stdin.destroy();      // (nothing left to keep the process alive)
  }
}

process.exitCode = await main();
