// An offline OpenAI Agents JS model for the adapter's tests: it answers each turn with the next
// scripted output items and keeps every request, so a test reads what the model was shown.

import assert from "node:assert/strict";
import {
  Usage,
  type AgentInputItem,
  type AgentOutputItem,
  type Model,
  type ModelRequest,
  type ModelResponse,
} from "@openai/agents";

/** A model that answers each turn with the next scripted output items. */
export class ScriptedModel implements Model {
  readonly requests: ModelRequest[] = [];
  constructor(private readonly turns: AgentOutputItem[][]) {}

  async getResponse(request: ModelRequest): Promise<ModelResponse> {
    this.requests.push(request);
    const output = this.turns[this.requests.length - 1];
    if (!output) throw new Error(`the script has no turn ${this.requests.length}`);
    return { usage: new Usage(), output, responseId: `resp-${this.requests.length}` };
  }

  // eslint-disable-next-line require-yield
  async *getStreamedResponse(): AsyncIterable<never> {
    throw new Error("this scripted model does not stream");
  }

  /** The function-call outputs (text) the model read in request `n` (default the last). */
  resultsRead(n = this.requests.length - 1): string[] {
    const input = this.requests[n].input as AgentInputItem[];
    return input
      .filter((item) => item.type === "function_call_result")
      .map((item) => {
        const output = (item as { output: { type: string; text: string } }).output;
        assert.equal(output.type, "text");
        return output.text;
      });
  }
}
