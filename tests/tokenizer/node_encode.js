// Encodes a UTF-8 file with the reference encoder of the npm package gpt-3-encoder
// (its own Encoder.js, unmodified) and prints the ids separated by spaces.
//   usage: node node_encode.js TOKENIZER_DIR FILE [--time]
// Encoder.js's encode() grows its result with Array.concat (quadratic in the text), so
// the text is fed in chunks of about 4 KiB cut where a non-space character is followed
// by whitespace: no pre-tokenisation match can span such a point or depend on what
// precedes it, so the concatenated ids are exactly those of the whole text.
'use strict';
const fs = require('fs');
const path = require('path');
const [dir, file, timeFlag] = process.argv.slice(2);
if (!dir || !file) {
  console.error('usage: node node_encode.js TOKENIZER_DIR FILE [--time]');
  process.exit(2);
}
const { encode } = require(path.resolve(dir, 'Encoder.js'));
const text = fs.readFileSync(file, 'utf8');
const isWs = c => /\s/u.test(c);
const t0 = process.hrtime.bigint();
const out = [];
let start = 0;
for (let i = 1; i <= text.length; i++) {
  if (i === text.length || (i - start >= 4096 && isWs(text[i]) && !isWs(text[i - 1]))) {
    for (const id of encode(text.slice(start, i))) out.push(id);
    start = i;
  }
}
const secs = Number(process.hrtime.bigint() - t0) / 1e9;
if (timeFlag === '--time') {
  const bytes = fs.statSync(file).size;
  console.log(JSON.stringify({ bytes, seconds: secs, mb_per_s: bytes / 1e6 / secs, tokens: out.length }));
} else {
  process.stdout.write(out.join(' ') + '\n');
}
