// Local key derivation: the same canonicalization (RFC 8785, JCS), key and fingerprint as the
// server, written from RFC 8259, RFC 8785 and the ledger's rules in JavaScript's own terms (a
// parser of its own; numbers and strings as ECMAScript writes them, which RFC 8785 adopts), not
// from the project's reference generator (testdata/generate_key_vectors.py), so that the shared
// vectors stay evidence; checked against every case of testdata/key-vectors.json.
//
//   canonical   = JCS(arguments)
//   key         = hex(sha256("idem.v1" 0x00 run_id 0x00 tool 0x00 canonical))
//   fingerprint = hex(sha256("idem.v1.fp" 0x00 tool 0x00 canonical))
//
// JSON.parse is not used on purpose: it keeps the last of duplicate members, accepts lone
// surrogate escapes and rounds big integers silently, all of which the server refuses. The small
// parser below refuses what the server refuses, with the server's reason strings.

import { createHash } from "node:crypto";
import { Buffer } from "node:buffer";
import { InvalidArgumentError } from "./error-base.js";

/** How arguments are turned into canonical text: strict JCS (the default) or the lenient form. */
export type Canonicalization = "JCS" | "JCS_LENIENT";

/** The server's size and depth limits (`--max-arguments-bytes`, `--max-json-depth`). */
export interface ArgumentLimits {
  maxBytes: number;
  maxDepth: number;
}

export const DEFAULT_LIMITS: Readonly<ArgumentLimits> = Object.freeze({
  maxBytes: 1_048_576,
  maxDepth: 64,
});

/** Tool-call arguments: JSON text, or a JS value serialized as described in the README. */
export type ArgumentsInput = string | Record<string, unknown>;

/** The reasons for which arguments are refused, as the server names them. */
export type ArgumentsRefusal =
  | "INVALID_JSON"
  | "DUPLICATE_MEMBER"
  | "LONE_SURROGATE"
  | "UNSAFE_INTEGER"
  | "JSON_TOO_DEEP"
  | "ARGUMENTS_TOO_LARGE"
  | "ARGUMENTS_NOT_OBJECT";

// --- the parsed model ----------------------------------------------------------------------

/** A parsed object: members in input order, names unique. */
class JsonObject {
  constructor(readonly members: Array<[string, JsonValue]>) {}
}

type JsonValue = null | boolean | number | string | JsonValue[] | JsonObject;

function refuse(reason: ArgumentsRefusal, message: string): never {
  throw new InvalidArgumentError(`arguments_json: ${message}`, {
    reason,
    field: "arguments_json",
    local: true,
  });
}

// --- parsing -------------------------------------------------------------------------------

const NUMBER = /-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?/y;
const HEX4 = /^[0-9a-fA-F]{4}$/;

class Parser {
  private i = 0;
  private depth = 0;

  constructor(
    private readonly text: string,
    private readonly maxDepth: number,
  ) {}

  parseDocument(): JsonValue {
    const value = this.value();
    this.ws();
    if (this.i < this.text.length) this.fail("INVALID_JSON", "trailing data after the JSON value");
    return value;
  }

  private at(): string {
    // The server counts in UTF-8 bytes.
    return `at byte ${Buffer.byteLength(this.text.slice(0, this.i), "utf8")}`;
  }

  private fail(reason: ArgumentsRefusal, message: string): never {
    refuse(reason, `${message} ${this.at()}`);
  }

  private ws(): void {
    const t = this.text;
    while (this.i < t.length) {
      const c = t.charCodeAt(this.i);
      if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) this.i++;
      else break;
    }
  }

  private value(): JsonValue {
    this.ws();
    if (this.i >= this.text.length) this.fail("INVALID_JSON", "unexpected end of text");
    const c = this.text[this.i];
    switch (c) {
      case "{":
        return this.object();
      case "[":
        return this.array();
      case '"':
        return this.string();
      case "t":
        return this.literal("true", true);
      case "f":
        return this.literal("false", false);
      case "n":
        return this.literal("null", null);
      default:
        if (c === "-" || (c >= "0" && c <= "9")) return this.number();
        return this.fail("INVALID_JSON", `unexpected character ${JSON.stringify(c)}`);
    }
  }

  private literal<T extends JsonValue>(word: string, value: T): T {
    if (!this.text.startsWith(word, this.i)) this.fail("INVALID_JSON", "invalid literal");
    this.i += word.length;
    return value;
  }

  private enter(): void {
    this.depth++;
    if (this.depth > this.maxDepth) {
      this.fail("JSON_TOO_DEEP", `nesting deeper than ${this.maxDepth}`);
    }
  }

  private object(): JsonObject {
    this.enter();
    this.i++; // {
    const members: Array<[string, JsonValue]> = [];
    const seen = new Set<string>();
    this.ws();
    if (this.text[this.i] === "}") {
      this.i++;
      this.depth--;
      return new JsonObject(members);
    }
    for (;;) {
      this.ws();
      if (this.text[this.i] !== '"') this.fail("INVALID_JSON", "expected a member name");
      const nameAt = this.i;
      const name = this.string();
      if (seen.has(name)) {
        this.i = nameAt;
        this.fail("DUPLICATE_MEMBER", `duplicate member name ${JSON.stringify(name)}`);
      }
      seen.add(name);
      this.ws();
      if (this.text[this.i] !== ":") this.fail("INVALID_JSON", "expected ':'");
      this.i++;
      members.push([name, this.value()]);
      this.ws();
      const c = this.text[this.i];
      if (c === ",") {
        this.i++;
        continue;
      }
      if (c === "}") {
        this.i++;
        break;
      }
      this.fail("INVALID_JSON", "expected ',' or '}'");
    }
    this.depth--;
    return new JsonObject(members);
  }

  private array(): JsonValue[] {
    this.enter();
    this.i++; // [
    const items: JsonValue[] = [];
    this.ws();
    if (this.text[this.i] === "]") {
      this.i++;
      this.depth--;
      return items;
    }
    for (;;) {
      items.push(this.value());
      this.ws();
      const c = this.text[this.i];
      if (c === ",") {
        this.i++;
        continue;
      }
      if (c === "]") {
        this.i++;
        break;
      }
      this.fail("INVALID_JSON", "expected ',' or ']'");
    }
    this.depth--;
    return items;
  }

  private string(): string {
    const t = this.text;
    this.i++; // opening quote
    let out = "";
    let run = this.i; // start of the current run of plain characters
    for (;;) {
      if (this.i >= t.length) this.fail("INVALID_JSON", "unterminated string");
      const c = t.charCodeAt(this.i);
      if (c === 0x22) {
        out += t.slice(run, this.i);
        this.i++;
        return out;
      }
      if (c < 0x20) this.fail("INVALID_JSON", "unescaped control character in a string");
      if (c >= 0xd800 && c <= 0xdfff) {
        // A raw surrogate (a JS string can hold one; UTF-8 text cannot): only a pair is valid.
        const next = t.charCodeAt(this.i + 1);
        if (c <= 0xdbff && next >= 0xdc00 && next <= 0xdfff) {
          this.i += 2;
          continue;
        }
        this.fail("LONE_SURROGATE", `lone surrogate U+${c.toString(16).toUpperCase()}`);
      }
      if (c !== 0x5c) {
        this.i++;
        continue;
      }
      out += t.slice(run, this.i);
      const escapeAt = this.i;
      const e = t[this.i + 1];
      this.i += 2;
      switch (e) {
        case '"':
          out += '"';
          break;
        case "\\":
          out += "\\";
          break;
        case "/":
          out += "/";
          break;
        case "b":
          out += "\b";
          break;
        case "f":
          out += "\f";
          break;
        case "n":
          out += "\n";
          break;
        case "r":
          out += "\r";
          break;
        case "t":
          out += "\t";
          break;
        case "u": {
          const unit = this.hex4(escapeAt);
          if (unit >= 0xd800 && unit <= 0xdbff) {
            // A high surrogate must be followed by an escaped low surrogate.
            if (t[this.i] === "\\" && t[this.i + 1] === "u") {
              const save = this.i;
              this.i += 2;
              const low = this.hex4(save);
              if (low >= 0xdc00 && low <= 0xdfff) {
                out += String.fromCharCode(unit, low);
                break;
              }
            }
            this.i = escapeAt;
            this.fail("LONE_SURROGATE", `lone surrogate U+${unit.toString(16).toUpperCase()}`);
          }
          if (unit >= 0xdc00 && unit <= 0xdfff) {
            this.i = escapeAt;
            this.fail("LONE_SURROGATE", `lone surrogate U+${unit.toString(16).toUpperCase()}`);
          }
          out += String.fromCharCode(unit);
          break;
        }
        default:
          this.i = escapeAt;
          this.fail("INVALID_JSON", "invalid escape in a string");
      }
      run = this.i;
    }
  }

  private hex4(escapeAt: number): number {
    const digits = this.text.slice(this.i, this.i + 4);
    if (!HEX4.test(digits)) {
      this.i = escapeAt;
      this.fail("INVALID_JSON", "invalid \\u escape");
    }
    this.i += 4;
    return parseInt(digits, 16);
  }

  private number(): number {
    NUMBER.lastIndex = this.i;
    const m = NUMBER.exec(this.text);
    if (!m) this.fail("INVALID_JSON", "invalid number");
    const literal = m[0];
    const start = this.i;
    this.i += literal.length;
    const next = this.text[this.i];
    if (next !== undefined && /[0-9.eE+-]/.test(next)) {
      this.fail("INVALID_JSON", "invalid number");
    }
    const read = readNumber(literal);
    if (typeof read !== "number") {
      this.i = start;
      this.fail("UNSAFE_INTEGER", read.refused);
    }
    return read;
  }
}

/**
 * Reads a JSON number literal as JavaScript does. Only an integer *literal* (no fraction, no
 * exponent) whose value a double cannot hold exactly is refused: its writer meant that integer
 * (an identifier, an exact amount) and would silently get another. A literal with a fraction or
 * an exponent is a double by its spelling (`1e23`, `9007199254740993.0`) and is read as the
 * nearest one. Values beyond the double range are refused whatever their spelling.
 */
function readNumber(literal: string): number | { refused: string } {
  const value = Number(literal); // correctly rounded; underflow gives (signed) zero
  if (!Number.isFinite(value)) return { refused: `${literal.slice(0, 64)} is beyond the double range` };
  if (/[.eE]/.test(literal)) return value;
  if (BigInt(literal) !== BigInt(value)) {
    return { refused: `${literal.slice(0, 64)} is an integer a double cannot hold exactly` };
  }
  return value;
}

function parse(text: string, limits: ArgumentLimits): JsonValue {
  const size = Buffer.byteLength(text, "utf8");
  if (size > limits.maxBytes) {
    refuse("ARGUMENTS_TOO_LARGE", `${size} bytes, limit ${limits.maxBytes}`);
  }
  return new Parser(text, limits.maxDepth).parseDocument();
}

// --- serialization -------------------------------------------------------------------------

/** ECMAScript Number::toString, which RFC 8785 adopts (with -0 written as 0). */
function formatNumber(value: number): string {
  return value === 0 ? "0" : String(value);
}

const SHORT_ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\b": "\\b",
  "\f": "\\f",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
};

/** A JCS string: only '"', '\\' and U+0000..U+001F are escaped. */
function formatString(s: string): string {
  // eslint-disable-next-line no-control-regex
  return `"${s.replace(/["\\\u0000-\u001f]/g, (ch) => {
    return SHORT_ESCAPES[ch] ?? `\\u${ch.charCodeAt(0).toString(16).padStart(4, "0")}`;
  })}"`;
}

function byName(a: [string, unknown], b: [string, unknown]): number {
  // JS string comparison is by UTF-16 code units, which is what JCS asks for.
  return a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0;
}

function serialize(value: JsonValue): string {
  if (value === null) return "null";
  if (value === true) return "true";
  if (value === false) return "false";
  if (typeof value === "number") return formatNumber(value);
  if (typeof value === "string") return formatString(value);
  if (Array.isArray(value)) return `[${value.map(serialize).join(",")}]`;
  const members = [...value.members].sort(byName);
  return `{${members.map(([n, v]) => `${formatString(n)}:${serialize(v)}`).join(",")}}`;
}

// Characters with the Unicode White_Space property (what the server's str::trim uses).
const WHITE_SPACE = new Set<number>([
  0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
  0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000,
]);

function trimWhiteSpace(s: string): string {
  let start = 0;
  let end = s.length;
  while (start < end && WHITE_SPACE.has(s.charCodeAt(start))) start++;
  while (end > start && WHITE_SPACE.has(s.charCodeAt(end - 1))) end--;
  return s.slice(start, end);
}

/** Trims White_Space around string values and drops null-valued members, at every depth. */
function lenient(value: JsonValue): JsonValue {
  if (typeof value === "string") return trimWhiteSpace(value);
  if (Array.isArray(value)) return value.map(lenient);
  if (value instanceof JsonObject) {
    return new JsonObject(
      value.members.filter(([, v]) => v !== null).map(([n, v]) => [n, lenient(v)]),
    );
  }
  return value;
}

// --- JS values -----------------------------------------------------------------------------

/**
 * A JS number as JSON text that reads back as the same double. JSON.stringify writes 2 ** 60 as
 * `1152921504606847000`, an integer literal the ledger refuses (a double cannot hold that
 * integer exactly); the exponent form says "a double", as the number is.
 */
function writeNumber(value: number): string {
  const text = formatNumber(value);
  if (/^-?[0-9]+$/.test(text) && BigInt(text) !== BigInt(value)) return value.toExponential();
  return text;
}

function notJson(message: string): never {
  refuse("INVALID_JSON", message);
}

function isRefusedObject(v: object): boolean {
  return (
    v instanceof Map ||
    v instanceof Set ||
    v instanceof WeakMap ||
    v instanceof WeakSet ||
    v instanceof RegExp ||
    v instanceof Promise ||
    ArrayBuffer.isView(v) ||
    v instanceof ArrayBuffer
  );
}

/**
 * Writes a JS value as JSON text in JCS member order. The rules (see the README):
 * strings, finite numbers, booleans and null as JSON.stringify writes them; a bigint with all its
 * digits; arrays; objects by their own enumerable string-keyed properties, skipping members whose
 * value is `undefined` (an absent optional field), and an object with a `toJSON()` method (such
 * as a Date) by what it returns. Refused (INVALID_JSON), where JSON.stringify would silently
 * change the value: NaN and ±Infinity, `undefined`, functions and symbols inside arrays or as
 * values, Map, Set, typed arrays and other built-ins, and cycles.
 */
function writeValue(value: unknown, path: string, stack: Set<object>): string {
  if (value !== null && typeof value === "object" && typeof (value as { toJSON?: unknown }).toJSON === "function") {
    value = (value as { toJSON(key: string): unknown }).toJSON("");
  }
  switch (typeof value) {
    case "string":
      return formatString(value);
    case "boolean":
      return value ? "true" : "false";
    case "number":
      if (!Number.isFinite(value)) notJson(`${path} is ${value}, which JSON cannot carry`);
      return writeNumber(value);
    case "bigint":
      return value.toString();
    case "undefined":
      return notJson(`${path} is undefined`);
    case "function":
    case "symbol":
      return notJson(`${path} is a ${typeof value}`);
    default:
      break;
  }
  if (value === null) return "null";
  const obj = value as object;
  if (stack.has(obj)) notJson(`${path} is a cycle`);
  if (isRefusedObject(obj)) notJson(`${path} is a ${obj.constructor?.name ?? "built-in object"}`);
  stack.add(obj);
  try {
    if (Array.isArray(obj)) {
      return `[${obj.map((item, i) => writeValue(item, `${path}[${i}]`, stack)).join(",")}]`;
    }
    const members: Array<[string, string]> = [];
    for (const name of Object.keys(obj)) {
      const v = (obj as Record<string, unknown>)[name];
      if (v === undefined) continue;
      members.push([name, writeValue(v, `${path}.${name}`, stack)]);
    }
    members.sort(byName);
    return `{${members.map(([n, v]) => `${formatString(n)}:${v}`).join(",")}}`;
  } finally {
    stack.delete(obj);
  }
}

/**
 * The `arguments_json` text sent to the server: JSON text is passed through unchanged (the
 * server canonicalizes it); a JS value is written as JSON in JCS member order (see writeValue).
 */
export function toArgumentsJson(args: ArgumentsInput): string {
  if (typeof args === "string") return args;
  if (args === null || typeof args !== "object" || Array.isArray(args)) {
    refuse("ARGUMENTS_NOT_OBJECT", "arguments must be a JSON object");
  }
  return writeValue(args, "arguments", new Set());
}

// --- keys ----------------------------------------------------------------------------------

function limitsOf(limits?: Partial<ArgumentLimits>): ArgumentLimits {
  return { ...DEFAULT_LIMITS, ...(limits ?? {}) };
}

/**
 * The canonical text of tool-call arguments (JCS, or JCS after the lenient clean-up).
 * Throws InvalidArgumentError (field `arguments_json`, the server's reason) when refused.
 */
export function canonicalize(
  args: ArgumentsInput,
  canonicalization: Canonicalization = "JCS",
  limits?: Partial<ArgumentLimits>,
): string {
  let value = parse(toArgumentsJson(args), limitsOf(limits));
  if (!(value instanceof JsonObject)) {
    refuse("ARGUMENTS_NOT_OBJECT", "arguments must be a JSON object");
  }
  if (canonicalization === "JCS_LENIENT") value = lenient(value);
  else if (canonicalization !== "JCS") {
    throw new InvalidArgumentError(`unknown canonicalization ${String(canonicalization)}`, {
      reason: "INVALID_FIELD",
      field: "canonicalization",
      local: true,
    });
  }
  return serialize(value);
}

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** run_id and tool: 1 to 256 UTF-8 bytes, well-formed, no control characters (Unicode Cc). */
function checkName(field: string, s: string): string {
  const invalid = (why: string): never => {
    throw new InvalidArgumentError(`${field}: ${why}`, {
      reason: "INVALID_FIELD",
      field,
      local: true,
    });
  };
  if (typeof s !== "string") invalid("must be a string");
  const size = Buffer.byteLength(s, "utf8");
  if (size < 1 || size > 256) invalid("must be 1 to 256 bytes");
  if (LONE_SURROGATE.test(s)) invalid("must be valid Unicode (it has a lone surrogate)");
  // eslint-disable-next-line no-control-regex
  if (/[\u0000-\u001f\u007f-\u009f]/.test(s)) invalid("must not contain control characters");
  return s;
}

function hash(...parts: string[]): string {
  const h = createHash("sha256");
  parts.forEach((part, i) => {
    if (i > 0) h.update(Buffer.of(0));
    h.update(part, "utf8");
  });
  return h.digest("hex");
}

/** The derived key of a tool call, as the server computes it. */
export function deriveKey(
  runId: string,
  tool: string,
  args: ArgumentsInput,
  canonicalization: Canonicalization = "JCS",
  limits?: Partial<ArgumentLimits>,
): string {
  checkName("run_id", runId);
  checkName("tool", tool);
  const canonical = canonicalize(args, canonicalization, limits);
  const domain = canonicalization === "JCS_LENIENT" ? "idem.v1.lenient" : "idem.v1";
  return hash(domain, runId, tool, canonical);
}

/** The fingerprint of (tool, arguments): what an explicit key is checked against. */
export function fingerprint(
  tool: string,
  args: ArgumentsInput,
  canonicalization: Canonicalization = "JCS",
  limits?: Partial<ArgumentLimits>,
): string {
  checkName("tool", tool);
  const canonical = canonicalize(args, canonicalization, limits);
  const domain = canonicalization === "JCS_LENIENT" ? "idem.v1.lenient.fp" : "idem.v1.fp";
  return hash(domain, tool, canonical);
}
