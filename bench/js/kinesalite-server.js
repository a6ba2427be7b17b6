// kinesalite (the npm Kinesis emulator, in memory) on a free loopback port, for
// bench/kinesis.py: prints {"url": ...} as one line on stdout once it listens, and runs
// until SIGTERM. Its own CLI cannot listen on port 0 nor serve a certificate of ours.
//
//   node bench/js/kinesalite-server.js [--cert FILE --key FILE] [--shardLimit N] [--createStreamMs MS]
//
// --cert/--key: HTTPS with that certificate (bench/kinesis.py: one from the cluster's CA,
// the transport of the SMS endpoint); without them plain HTTP, kinesalite's default.
'use strict'
const fs = require('fs')

const args = {}
for (let i = 2; i < process.argv.length; i += 2) {
  const name = process.argv[i].replace(/^--/, '')
  if (i + 1 >= process.argv.length) throw new Error(`--${name} needs a value`)
  args[name] = process.argv[i + 1]
}
const options = {
  createStreamMs: Number(args.createStreamMs || 0),
  deleteStreamMs: 0,
  updateStreamMs: 0,
  shardLimit: Number(args.shardLimit || 1000),
}
if (args.cert) {
  options.ssl = true
  options.cert = fs.readFileSync(args.cert)
  options.key = fs.readFileSync(args.key)
}
const server = require('kinesalite')(options)
if (options.ssl) {
  // Node's HTTP server pauses a connection (socket and parser) when a request comes while
  // the last answer has not drained (its guard against floods of pipelined requests).
  // Over TLS the answer's drain is seen late and bytes already decrypted still reach the
  // paused parser: "Parse Error: Paused", the connection is cut mid-request, and
  // kinesalite throws on the aborted request and exits. boto3 never pipelines: no pause.
  server.prependListener('secureConnection', (socket) => {
    Object.defineProperty(socket, '_paused', { get: () => false, set: () => {} })
    socket.pause = function () { return this }
  })
}
server.listen(0, '127.0.0.1', () => {
  const { address, port } = server.address()
  console.log(JSON.stringify({ url: `${options.ssl ? 'https' : 'http'}://${address}:${port}`,
                               kinesalite: require('kinesalite/package.json').version, node: process.version }))
})
process.on('SIGTERM', () => process.exit(0))
process.on('SIGINT', () => process.exit(0))
