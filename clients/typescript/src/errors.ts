/**
 * Errors of the Assay client: every failed call rejects with a `ConnectError` (gRPC code,
 * message, details); bad input comes back as INVALID_ARGUMENT with a `google.rpc.BadRequest`
 * detail naming each offending field, which {@link fieldViolations} decodes.
 */
import { Code, ConnectError } from "@connectrpc/connect";

import { BadRequestSchema } from "./gen/google/rpc/error_details_pb.js";

/** A `ConnectError` with the request fields the gateway refused (empty when none were named). */
export type AssayError = ConnectError & { fields: Record<string, string> };

/**
 * The field violations of a refused call: `{"pipeline.records[3].input": "must not be blank"}`.
 * Empty for any other error (or anything that is not a `ConnectError`).
 */
export function fieldViolations(err: unknown): Record<string, string> {
  if (!(err instanceof ConnectError)) {
    return {};
  }
  const fields: Record<string, string> = {};
  for (const bad of err.findDetails(BadRequestSchema)) {
    for (const v of bad.fieldViolations) {
      fields[v.field] = fields[v.field] === undefined ? v.description : `${fields[v.field]}; ${v.description}`;
    }
  }
  return fields;
}

/** `err` as a `ConnectError` carrying `fields` (what every client method rejects with). */
export function toAssayError(err: unknown): AssayError {
  const ce = ConnectError.from(err, Code.Unknown) as AssayError;
  if (ce.fields === undefined) {
    ce.fields = fieldViolations(ce);
  }
  return ce;
}

/** Run `fn`, turning any rejection into an {@link AssayError}. */
export async function decorated<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw toAssayError(err);
  }
}
