// The model turn the framework examples play, the same in each: the tool calls a model emits,
// step by step, as the JSON text it writes. It has the repeats real agents produce: the same
// call twice in one step (run in parallel by the framework), then the same intent again with
// its members in another order and the amount spelled 2e2, next to the reply.

/** One tool call as the model writes it. */
export interface ScriptedCall {
  name: string;
  arguments: string;
}

export const PROMPT =
  "Customer c-42 was charged 200 EUR twice (ticket T-1001). Credit them and tell them on the ticket.";

export const STEPS: ScriptedCall[][] = [
  [
    { name: "issue_credit", arguments: '{"customer":"c-42","amount":200,"currency":"EUR"}' },
    { name: "issue_credit", arguments: '{"customer":"c-42","amount":200,"currency":"EUR"}' },
  ],
  [
    { name: "issue_credit", arguments: '{"currency":"EUR","amount":2e2,"customer":"c-42"}' },
    { name: "send_reply", arguments: '{"ticket":"T-1001","body":"We have credited 200 EUR to your account."}' },
  ],
];

export const FINAL_TEXT = "I credited 200 EUR to c-42 and told them on ticket T-1001.";

/** The run id of an example: RUN_ID, or a new one (a new run is a new intent). */
export function runIdFromEnv(): string {
  return process.env.RUN_ID ?? `run-${Date.now().toString(36)}`;
}
