/**
 * Wire compatibility: the server's protos (by gRPC reflection, `grpc.reflection.v1`) compared
 * with the ones this client was generated from. The `v1` packages only grow, so anything the
 * server has and the client lacks means a newer server: reported, never fatal.
 */
import { type DescFile, type Registry, createRegistry, fromBinary } from "@bufbuild/protobuf";
import {
  type DescriptorProto,
  type EnumDescriptorProto,
  type FileDescriptorProto,
  FileDescriptorProtoSchema,
} from "@bufbuild/protobuf/wkt";
import { Code, ConnectError, type Transport, createClient } from "@connectrpc/connect";

import { GatewayService, file_assay_gateway_v1_gateway } from "./gen/assay/gateway/v1/gateway_pb.js";
import { ServerReflection } from "./gen/grpc/reflection/v1/reflection_pb.js";

/** The proto package version the client was generated from. */
export const PROTO_VERSION = "v1";

/** Deadline of the automatic check, milliseconds. */
export const AUTO_CHECK_TIMEOUT_MS = 3_000;

/** Automatic checks that found the server unreachable before the client stops trying. */
export const AUTO_CHECK_ATTEMPTS = 3;

function withDependencies(file: DescFile, seen = new Map<string, DescFile>()): DescFile[] {
  if (!seen.has(file.name)) {
    seen.set(file.name, file);
    for (const dep of file.dependencies) {
      withDependencies(dep, seen);
    }
  }
  return [...seen.values()];
}

/** The client's own descriptors: the gateway's proto and everything it imports. */
export const localRegistry: Registry = createRegistry(...withDependencies(file_assay_gateway_v1_gateway));

function* messagesOf(prefix: string, messages: DescriptorProto[]): Generator<[string, DescriptorProto]> {
  for (const m of messages) {
    const name = `${prefix}.${m.name}`;
    yield [name, m];
    yield* messagesOf(name, m.nestedType);
  }
}

function enumDifferences(local: Registry, name: string, e: EnumDescriptorProto): string[] {
  const known = local.getEnum(name);
  if (known === undefined) {
    return [`enum ${name}`];
  }
  const numbers = new Set(known.values.map((v) => v.number));
  return e.value.filter((v) => !numbers.has(v.number)).map((v) => `enum value ${name}.${v.name} = ${v.number}`);
}

/**
 * What the server's `files` (the `assay.*` ones) have that `local` lacks: messages, fields (by
 * number), enums and enum values, services and methods, e.g. `"field assay.gateway.v1.Run.owner = 99"`.
 * Empty: the server is this client's version (or older).
 */
export function differences(files: FileDescriptorProto[], local: Registry = localRegistry): string[] {
  const out: string[] = [];
  for (const file of files) {
    if (!file.package.startsWith("assay.")) {
      continue;
    }
    for (const [name, message] of messagesOf(file.package, file.messageType)) {
      const known = local.getMessage(name);
      if (known === undefined) {
        out.push(`message ${name}`);
        continue;
      }
      const numbers = new Set(known.fields.map((f) => f.number));
      for (const f of message.field) {
        if (!numbers.has(f.number)) {
          out.push(`field ${name}.${f.name} = ${f.number}`);
        }
      }
      for (const e of message.enumType) {
        out.push(...enumDifferences(local, `${name}.${e.name}`, e));
      }
    }
    for (const e of file.enumType) {
      out.push(...enumDifferences(local, `${file.package}.${e.name}`, e));
    }
    for (const s of file.service) {
      const full = `${file.package}.${s.name}`;
      const known = local.getService(full);
      if (known === undefined) {
        out.push(`service ${full}`);
        continue;
      }
      const names = new Set(known.methods.map((m) => m.name));
      out.push(...s.method.filter((m) => !names.has(m.name)).map((m) => `method ${full}.${m.name}`));
    }
  }
  return out;
}

/**
 * The file descriptors the server's reflection gives for the gateway service (its file and
 * imports). Rejects with the call's `ConnectError` (UNIMPLEMENTED: no reflection).
 */
export async function reflectFiles(
  transport: Transport,
  options: { timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<FileDescriptorProto[]> {
  const client = createClient(ServerReflection, transport);
  async function* requests() {
    yield { messageRequest: { case: "fileContainingSymbol" as const, value: GatewayService.typeName } };
  }
  const files = new Map<string, FileDescriptorProto>();
  for await (const res of client.serverReflectionInfo(requests(), options)) {
    const r = res.messageResponse;
    if (r.case === "errorResponse") {
      throw new ConnectError(`reflection: ${r.value.errorMessage}`, r.value.errorCode as Code);
    }
    if (r.case === "fileDescriptorResponse") {
      for (const blob of r.value.fileDescriptorProto) {
        const file = fromBinary(FileDescriptorProtoSchema, blob);
        files.set(file.name, file);
      }
    }
  }
  return [...files.values()];
}

/** The text of the warning about a newer server. */
export function newerMessage(found: string[]): string {
  const more = found.length > 10 ? ` and ${found.length - 10} more` : "";
  return `the server's protos are newer than this client's: ${found.slice(0, 10).join(", ")}${more}`;
}

/** The default `onServerNewer`: a process warning of type `ServerNewerWarning`. */
export function emitServerNewer(found: string[]): void {
  process.emitWarning(newerMessage(found), { type: "ServerNewerWarning", code: "ASSAY_SERVER_NEWER" });
}
