// The console's one script: it turns the pages' forms and buttons into calls of the
// console's JSON API (same origin, session cookie), and streams the playground.
"use strict";

// Where the console lives: "/console", or "<prefix>/console" when mounted in a host app.
const CONSOLE = document.documentElement.dataset.console || "/console";
const PROOFS = CONSOLE.slice(0, -"/console".length) + "/proofs/";

function showError(form, message) {
  const box = form.querySelector(".form-error");
  if (box) {
    box.textContent = message;
    box.hidden = false;
  }
}

async function callApi(path, method, body) {
  const response = await fetch(path, {
    method: method,
    credentials: "same-origin",
    headers: { "content-type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 204) return {};
  let data = {};
  try {
    data = await response.json();
  } catch (e) {
    data = {};
  }
  if (!response.ok) {
    if (response.status === 401 && !path.endsWith("/login")) {
      window.location.assign(CONSOLE + "/login");
    }
    const error = data.error || {};
    throw new Error(error.message || "The request failed (" + response.status + ").");
  }
  return data;
}

function formBody(form) {
  const body = {};
  const emptyNull = form.hasAttribute("data-empty-null");
  for (const input of form.querySelectorAll("input[name], select[name], textarea[name]")) {
    const name = input.name;
    if (input.type === "checkbox") {
      if (!(name in body)) body[name] = [];
      if (input.checked) body[name].push(input.value);
      continue;
    }
    let value = input.hasAttribute("data-raw") ? input.value : input.value.trim();
    if (value === "") {
      if (emptyNull) body[name] = input.hasAttribute("data-list") && name === "exclude_models" ? [] : null;
      continue;
    }
    if (input.hasAttribute("data-int")) value = parseInt(value, 10);
    if (input.hasAttribute("data-list")) {
      value = value.split(",").map((part) => part.trim()).filter((part) => part !== "");
    }
    body[name] = value;
  }
  return body;
}

function reveal(secret) {
  const panel = document.getElementById("reveal");
  document.getElementById("reveal-value").textContent = secret;
  panel.hidden = false;
  // The list above is from before this key: its "No key yet." would contradict the panel.
  document.querySelectorAll("p.empty").forEach((empty) => { empty.hidden = true; });
  panel.scrollIntoView({ block: "nearest" });
}

async function submitForm(event) {
  const form = event.target.closest("form[data-api]");
  if (!form) return;
  event.preventDefault();
  const question = form.getAttribute("data-confirm");
  if (question && !window.confirm(question)) return;
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  form.querySelector(".form-error").hidden = true;
  try {
    const data = await callApi(form.dataset.api, form.dataset.method || "POST", formBody(form));
    if (data.status === "pending") {
      showError(form, "Pending: " + data.confirmations + " of " + data.confirmations_needed +
        " confirmations. Try again in a minute.");
    } else if (form.dataset.reveal) {
      form.reset();
      reveal(data[form.dataset.reveal]);
    } else if (form.dataset.next) {
      window.location.assign(form.dataset.next.replace("{id}", encodeURIComponent(data.id || "")));
    } else {
      window.location.reload();
    }
  } catch (error) {
    showError(form, error.message);
  } finally {
    button.disabled = false;
  }
}

async function postButton(button) {
  const question = button.getAttribute("data-confirm");
  if (question && !window.confirm(question)) return;
  button.disabled = true;
  try {
    await callApi(button.dataset.post, "POST", {});
    window.location.reload();
  } catch (error) {
    const note = document.createElement("span");
    note.className = "inline-error";
    note.setAttribute("role", "alert");
    note.textContent = error.message;
    button.after(note);
    button.disabled = false;
  }
}

async function copyText(button) {
  const text = document.getElementById(button.dataset.copy).textContent;
  const done = document.querySelector(".copied");
  try {
    await navigator.clipboard.writeText(text);
    done.textContent = "Copied.";
  } catch (error) {
    const range = document.createRange();
    range.selectNodeContents(document.getElementById(button.dataset.copy));
    window.getSelection().removeAllRanges();
    window.getSelection().addRange(range);
    done.textContent = "Selected: press Ctrl+C to copy.";
  }
  done.hidden = false;
}

// Server-Sent Events from fetch: calls `onData` with each `data:` payload (and the
// event's name, "message" when it has none).
async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let name = "message";
      for (const line of event.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        if (line.startsWith("data: ")) onData(line.slice(6), name);
      }
    }
  }
}

function showReceipt(box, projectId, receiptId) {
  box.textContent = "";
  if (!receiptId) {
    box.textContent = "No receipt: nothing was billed.";
    return;
  }
  const title = document.createElement("p");
  title.append("Receipt ", proofLink(receiptId, "receipt-id"));
  box.append(title);
  callApi(CONSOLE + "/api/projects/" + encodeURIComponent(projectId) + "/receipts?limit=10", "GET")
    .then((list) => {
      const receipt = list.data.find((item) => item.id === receiptId);
      if (!receipt) return;
      const facts = document.createElement("p");
      facts.className = "receipt-facts";
      facts.textContent =
        receipt.status + " · " + (receipt.model || receipt.runtime) + " · " +
        (receipt.usage.input_tokens || 0) + " input and " +
        (receipt.usage.output_tokens || 0) + " output tokens · cost " + usd(receipt.cost);
      box.append(facts);
    })
    .catch(() => {});
}

function proofLink(receiptId, className) {
  const link = document.createElement("a");
  link.href = PROOFS + encodeURIComponent(receiptId);
  link.textContent = receiptId;
  if (className) link.className = className;
  return link;
}

// The playground's conversation: the exchanges so far, sent before each new message.
const conversation = [];

function bubble(role, text) {
  const list = document.getElementById("conversation");
  document.getElementById("conversation-empty").hidden = true;
  const item = document.createElement("li");
  item.className = "msg " + role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "You" : "Model";
  const body = document.createElement("div");
  body.className = "text";
  body.textContent = text;
  item.append(who, body);
  list.append(item);
  return item;
}

function clearConversation() {
  conversation.length = 0;
  const list = document.getElementById("conversation");
  list.querySelectorAll("li.msg").forEach((item) => item.remove());
  document.getElementById("conversation-empty").hidden = false;
}

function playRequest(form, message) {
  const messages = [];
  const system = form.elements.system.value;
  if (system.trim() !== "") messages.push({ role: "system", content: system });
  const body = {
    model: form.elements.model.value,
    stream: form.elements.stream.checked,
    messages: messages.concat(conversation, [{ role: "user", content: message }]),
  };
  const maxTokens = form.elements.max_tokens.value.trim();
  if (maxTokens !== "") body.max_tokens = parseInt(maxTokens, 10);
  const temperature = form.elements.temperature.value.trim();
  if (temperature !== "") body.temperature = Number(temperature);
  return body;
}

async function play(event) {
  event.preventDefault();
  const form = event.target;
  const projectId = form.dataset.project;
  const receiptBox = document.getElementById("receipt");
  const button = form.querySelector("button[type=submit]");
  const message = form.elements.message.value;
  const body = playRequest(form, message);
  form.querySelector(".form-error").hidden = true;
  const asked = bubble("user", message);
  const answer = bubble("assistant", "");
  // The reply being written is #output, as before conversations.
  const previous = document.getElementById("output");
  if (previous) previous.removeAttribute("id");
  const output = answer.querySelector(".text");
  output.id = "output";
  receiptBox.textContent = "Waiting for the call to finish…";
  button.disabled = true;
  try {
    const response = await fetch(
      CONSOLE + "/api/projects/" + encodeURIComponent(projectId) + "/playground/chat/completions",
      {
        method: "POST",
        credentials: "same-origin",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(body),
      },
    );
    const receiptId = response.headers.get("x-receipt-id");
    if (!response.ok) {
      const data = await response.json().catch(() => ({}));
      throw new Error((data.error && data.error.message) || "The call failed.");
    }
    if (body.stream) {
      await readEvents(response, (payload) => {
        if (payload === "[DONE]") return;
        const chunk = JSON.parse(payload);
        if (chunk.error) {
          showError(form, chunk.error.message);
          return;
        }
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) output.textContent += delta.content;
      });
    } else {
      const data = await response.json();
      output.textContent = data.choices[0].message.content || "";
    }
    conversation.push(
      { role: "user", content: message },
      { role: "assistant", content: output.textContent },
    );
    form.elements.message.value = "";
    if (receiptId) {
      const note = document.createElement("p");
      note.className = "turn-receipt";
      note.append("Receipt ", proofLink(receiptId));
      answer.append(note);
    }
    showReceipt(receiptBox, projectId, receiptId);
  } catch (error) {
    // A refused turn is not part of the conversation: the next one is sent without it.
    asked.remove();
    answer.remove();
    if (conversation.length === 0) document.getElementById("conversation-empty").hidden = false;
    showError(form, error.message);
    receiptBox.textContent = "No receipt: nothing was billed.";
  } finally {
    button.disabled = false;
  }
}

// "0.001200" -> "$0.0012": as html.usd, exact (BigInt micro-units), cents at least.
function usd(amount) {
  const value = micros(amount);
  const whole = (value / 1000000n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  let cents = (value % 1000000n).toString().padStart(6, "0").replace(/0+$/, "");
  while (cents.length < 2) cents += "0";
  return "$" + whole + "." + cents;
}

// A GET form of filters: only the fields with a value go into the URL (the server reads
// an empty one as no filter too, so the form works without this script).
function cleanQuery(event) {
  const form = event.target;
  event.preventDefault();
  const query = new URLSearchParams();
  for (const [name, value] of new FormData(form)) {
    if (String(value).trim() !== "") query.append(name, String(value).trim());
  }
  const search = query.toString();
  window.location.assign(form.getAttribute("action") + (search ? "?" + search : ""));
}

// A run's page: its steps as they close, the budget bar, the output or error at the end.
const BAR_WIDTH = 1000; // run_html.BAR_WIDTH

function stepRow(table, position, step) {
  const labels = Array.from(table.querySelectorAll("thead th"), (th) => th.textContent);
  const row = document.createElement("tr");
  const cells = [
    String(position + 1), step.kind, step.model || step.runtime, String(step.input_tokens),
    String(step.output_tokens), step.duration_ms + " ms", step.cost, null,
    step.error ? step.error.message : "",
  ];
  cells.forEach((text, n) => {
    const cell = document.createElement("td");
    cell.dataset.label = labels[n];
    if (n === 7 && step.receipt_id) {
      cell.append(proofLink(step.receipt_id));
    } else if (n === 6) {
      const amount = document.createElement("span");
      amount.className = "num";
      amount.textContent = usd(text);
      cell.append(amount);
    } else {
      cell.textContent = n === 7 ? "none" : text;
    }
    row.append(cell);
  });
  table.tBodies[0].append(row);
}

// A step's transcript, as transcript_html.step_item draws it on the server.
const ROLES = { system: "Instructions", user: "Input", tool: "Tool result", assistant: "Model" };

function element(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function cutNote(parent, cut) {
  if (cut) parent.append(element("p", "cut", "Cut at 64 KiB."));
}

function callPart(box, call) {
  let parsed = null;
  try {
    parsed = JSON.parse(call.arguments);
  } catch (error) {
    parsed = null;
  }
  const head = element("p", "call", "Calls ");
  head.append(element("code", "", call.name));
  const program = parsed && typeof parsed === "object" && typeof parsed.code === "string";
  if (program) head.append(" (" + (parsed.runtime == null ? "" : String(parsed.runtime)) + ")");
  box.append(head, element("pre", "code", program ? parsed.code : call.arguments));
  cutNote(box, call.truncated);
}

function messagePart(item, role, text, cut) {
  const box = element("div", "msg " + role);
  box.append(element("span", "who", ROLES[role] || role));
  if (text) box.append(element("pre", "text", text));
  cutNote(box, cut);
  item.append(box);
  return box;
}

function sandboxParts(item, transcript) {
  item.append(element("p", "part", "Code"), element("pre", "code", transcript.code));
  cutNote(item, transcript.code_truncated);
  if (!("stdout" in transcript)) {
    item.append(element("p", "note", "The program did not finish: no output."));
    return;
  }
  for (const name of ["stdout", "stderr"]) {
    item.append(element("p", "part", name), element("pre", "stream " + name, transcript[name]));
    cutNote(item, transcript[name + "_truncated"]);
  }
  const exit = element("p", "exit", "Exit code " + transcript.exit_code + " ");
  exit.dataset.ok = String(transcript.exit_code === 0 && transcript.status === "completed");
  exit.append(element("span", "note", "· " + transcript.status));
  item.append(exit);
}

function transcriptItem(list, position, step) {
  const item = element("li", "step");
  item.dataset.kind = step.kind;
  const head = element("div", "step-head");
  const receipt = element("span", "step-receipt", step.receipt_id ? "Receipt " : "No receipt");
  if (step.receipt_id) receipt.append(proofLink(step.receipt_id));
  head.append(
    element("span", "step-title",
      "Step " + (position + 1) + " · " + step.kind + " · " + (step.model || step.runtime)),
    receipt,
  );
  item.append(head);
  const transcript = step.transcript;
  if (!transcript) {
    item.append(element("p", "note", "No transcript was kept for this step."));
  } else if (step.kind === "model") {
    for (const message of transcript.messages) {
      messagePart(item, message.role, message.content, message.truncated);
    }
    const reply = transcript.reply;
    if (reply) {
      const box = messagePart(item, "assistant", reply.content, reply.truncated);
      for (const call of reply.tool_calls) callPart(box, call);
    }
  } else {
    sandboxParts(item, transcript);
  }
  if (step.error) item.append(element("p", "error-text", step.error.message || ""));
  list.append(item);
}

function showSpent(run) {
  document.getElementById("run-spent").textContent = usd(run.spent);
  document.getElementById("run-budget").textContent = usd(run.budget);
  // As run_html.spent_width: exact integers of micro-units, rounded down, capped.
  const budget = micros(run.budget);
  const width = budget > 0n ? (micros(run.spent) * BigInt(BAR_WIDTH)) / budget : 0n;
  const capped = width > BigInt(BAR_WIDTH) ? BAR_WIDTH : Number(width);
  document.getElementById("run-bar").setAttribute("width", String(capped));
}

// "12.5" -> 12500000n: an amount's decimal string in micro-units, without a float.
function micros(amount) {
  const [whole, fraction = ""] = amount.split(".");
  return BigInt(whole) * 1000000n + BigInt((fraction + "000000").slice(0, 6));
}

function showEnd(run) {
  showSpent(run);
  document.getElementById("run").dataset.running = "false";
  const status = document.getElementById("run-status");
  status.textContent = run.status;
  status.dataset.status = run.status;
  document.getElementById("run-output").textContent = run.output || "";
  document.getElementById("run-error").textContent =
    run.error ? run.error.type + ": " + run.error.message : "";
  document.getElementById("run-live").textContent = "";
  const cancel = document.getElementById("run-cancel");
  if (cancel) cancel.remove();
}

async function followRun(section) {
  const api = section.dataset.api;
  const table = document.getElementById("run-steps");
  const live = document.getElementById("run-live");
  const transcript = document.getElementById("run-transcript");
  let position = 0;
  try {
    const response = await fetch(api + "/events", { credentials: "same-origin" });
    if (!response.ok) throw new Error("The run's events could not be read.");
    // The stream gives every step again, in order.
    table.tBodies[0].textContent = "";
    transcript.textContent = "";
    await readEvents(response, (payload, name) => {
      const data = JSON.parse(payload);
      if (name === "step.started") {
        live.textContent = "Running step " + (position + 1) + ": " + data.kind + " " +
          (data.model || data.runtime) + "…";
      } else if (name === "step") {
        stepRow(table, position, data);
        transcriptItem(transcript, position, data);
        position += 1;
        live.textContent = "";
        callApi(api, "GET").then(showSpent).catch(() => {});
      } else if (name === "end") {
        showEnd(data);
      }
    });
  } catch (error) {
    live.textContent = error.message + " Reload the page to see the run.";
  }
}

const runSection = document.getElementById("run");
if (runSection && runSection.dataset.running === "true") followRun(runSection);

document.addEventListener("submit", (event) => {
  if (event.target.id === "playground") play(event);
  else if (event.target.hasAttribute("data-clean-query")) cleanQuery(event);
  else submitForm(event);
});

document.addEventListener("click", (event) => {
  const target = event.target.closest("button");
  if (!target) return;
  if (target.hasAttribute("data-logout")) {
    callApi(CONSOLE + "/api/logout", "POST", {}).finally(() => {
      window.location.assign(CONSOLE + "/login");
    });
  } else if (target.dataset.post) {
    postButton(target);
  } else if (target.dataset.copy) {
    copyText(target);
  } else if (target.hasAttribute("data-clear-conversation")) {
    clearConversation();
  }
});
