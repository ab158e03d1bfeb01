// How runOnce stores results: results are bytes on the wire; by default they are JSON.

/** Encodes an action's result to the bytes the ledger stores, and decodes a replayed one. */
export interface Codec<T> {
  encode(value: T): Uint8Array;
  decode(bytes: Uint8Array): T;
}

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/**
 * JSON (UTF-8). `undefined` is stored as no bytes and replayed as `undefined`; everything else
 * as JSON.stringify writes it, so a replay gives what JSON.parse(JSON.stringify(value)) gives.
 */
export const jsonCodec: Codec<unknown> = {
  encode(value: unknown): Uint8Array {
    if (value === undefined) return new Uint8Array(0);
    return encoder.encode(JSON.stringify(value));
  },
  decode(bytes: Uint8Array): unknown {
    if (bytes.length === 0) return undefined;
    return JSON.parse(decoder.decode(bytes));
  },
};

/** Stores the result bytes as they are. */
export const bytesCodec: Codec<Uint8Array> = {
  encode: (value) => value,
  decode: (bytes) => bytes,
};

/** Stores a string as UTF-8. */
export const textCodec: Codec<string> = {
  encode: (value) => encoder.encode(value),
  decode: (bytes) => decoder.decode(bytes),
};
