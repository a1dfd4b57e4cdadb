// shoal chat: talks to this agent's OpenAI-compatible endpoint from the
// browser with the API key kept in localStorage (the key dialog, or a login
// link's #key=KEY fragment taken by login.js). Answers stream in over SSE
// read with fetch (EventSource cannot send the key) and are shown through
// a small markdown renderer that escapes the model's text first: model
// output is untrusted. No framework, no build step.
'use strict';

const KEY_STORE = 'shoal.apiKey';
const MODEL_STORE = 'shoal.chatModel';
const params = new URLSearchParams(location.search);

const $ = (id) => document.getElementById(id);

let apiKey = localStorage.getItem(KEY_STORE) || '';
let messages = []; // the conversation so far: {role, content}
let busy = null; // the running exchange: {controller}
let chatID = 0; // counts new chats: an answer ending after one belongs to no conversation

class AuthError extends Error {}

// --- markdown ---

const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
function escapeHTML(s) { return String(s).replace(/[&<>"']/g, (c) => ESC[c]); }

// safeURL accepts a link target (already escaped) only with a scheme that
// cannot run script.
function safeURL(u) { return /^(https?:\/\/|mailto:)/i.test(u) ? u : null; }

// inline formats a span of escaped text: code, links, bold, italic,
// strikethrough. Code spans and links are set aside first so that their
// contents are not formatted again.
function inline(s) {
  const held = [];
  const hold = (html) => '\u0000' + (held.push(html) - 1) + '\u0000';
  s = s.replace(/`([^`\n]+)`/g, (_, code) => hold('<code>' + code + '</code>'));
  s = s.replace(/\[([^\]\n]+)\]\(((?:[^()\s]|\([^()\s]*\))+)\)/g, (all, text, url) => {
    const href = safeURL(url);
    if (!href) return hold(emphasis(text));
    return hold('<a href="' + href + '" target="_blank" rel="noopener noreferrer">' + emphasis(text) + '</a>');
  });
  s = emphasis(s);
  for (let i = 0; i < 4 && s.includes('\u0000'); i++) s = s.replace(/\u0000(\d+)\u0000/g, (_, n) => held[n]);
  return s;
}

function emphasis(s) {
  return s
    .replace(/\*\*(?=\S)([^\n]*?\S)\*\*/g, '<strong>$1</strong>')
    .replace(/(^|[^\w])__(?=\S)([^\n]*?\S)__(?!\w)/g, '$1<strong>$2</strong>')
    .replace(/\*(?=[^\s*])([^*\n]*?[^\s*])?\*/g, (all, t) => (t === undefined ? all : '<em>' + t + '</em>'))
    .replace(/(^|[^\w])_(?=[^\s_])([^_\n]*?[^\s_])?_(?!\w)/g, (all, pre, t) => (t === undefined ? all : pre + '<em>' + t + '</em>'))
    .replace(/~~(?=\S)([^\n]*?\S)~~/g, '<del>$1</del>');
}

// renderMarkdown turns untrusted text into HTML: the text is escaped
// first, then code fences, headings, lists, quotes, rules, paragraphs and
// the inline forms are recognised in the escaped text, so the only tags
// in the result are the renderer's own. An unterminated fence (an answer
// still streaming) runs to the end.
function renderMarkdown(src) {
  const lines = escapeHTML(String(src == null ? '' : src).replace(/\u0000/g, '').replace(/\r\n?/g, '\n')).split('\n');
  const out = [];
  let para = [];
  let list = null; // {tag, start, items}
  let quote = [];
  const flush = () => {
    if (para.length) out.push('<p>' + inline(para.join('\n')).replace(/\n/g, '<br>') + '</p>');
    if (list) {
      const start = list.tag === 'ol' && list.start !== 1 ? ' start="' + list.start + '"' : '';
      out.push('<' + list.tag + start + '>' + list.items.map((i) => '<li>' + inline(i).replace(/\n/g, '<br>') + '</li>').join('') + '</' + list.tag + '>');
    }
    if (quote.length) out.push('<blockquote>' + renderMarkdownEscaped(quote) + '</blockquote>');
    para = []; list = null; quote = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    let m;
    if ((m = /^\s*(`{3,}|~{3,})\s*([\w+#.-]*)/.exec(line))) {
      flush();
      const fence = m[1];
      const closing = new RegExp('^\\s*' + (fence[0] === '`' ? '`' : '~') + '{' + fence.length + ',}\\s*$');
      const code = [];
      for (i++; i < lines.length && !closing.test(lines[i]); i++) code.push(lines[i]);
      out.push('<pre><code' + (m[2] ? ' class="lang-' + m[2] + '"' : '') + '>' + code.join('\n') + '</code></pre>');
      continue;
    }
    if (/^\s*$/.test(line)) { flush(); continue; }
    if ((m = /^\s{0,3}&gt;\s?(.*)$/.exec(line))) {
      if (!quote.length) flush();
      quote.push(m[1]);
      continue;
    }
    if (quote.length) flush();
    if ((m = /^\s{0,3}(#{1,6})\s+(.*?)(\s+#+)?\s*$/.exec(line))) {
      flush();
      const n = m[1].length;
      out.push('<h' + n + '>' + inline(m[2]) + '</h' + n + '>');
      continue;
    }
    if (/^\s{0,3}([-*_])(\s*\1){2,}\s*$/.test(line)) { flush(); out.push('<hr>'); continue; }
    if ((m = /^\s{0,3}([-*+]|(\d{1,9})[.)])\s+(.*)$/.exec(line))) {
      const tag = m[2] ? 'ol' : 'ul';
      if (para.length || (list && list.tag !== tag)) flush();
      if (!list) list = { tag, start: m[2] ? Number(m[2]) : 1, items: [] };
      list.items.push(m[3]);
      continue;
    }
    if (list && /^\s{2,}\S/.test(line)) { list.items[list.items.length - 1] += '\n' + line.trim(); continue; }
    if (list) flush();
    para.push(line);
  }
  flush();
  return out.join('');
}

// renderMarkdownEscaped renders a quote's lines, which are escaped
// already: it undoes the escaping and renders them as a document of their
// own, which escapes them again.
function renderMarkdownEscaped(lines) {
  const un = { '&amp;': '&', '&lt;': '<', '&gt;': '>', '&quot;': '"', '&#39;': "'" };
  return renderMarkdown(lines.join('\n').replace(/&(amp|lt|gt|quot|#39);/g, (e) => un[e]));
}

// The renderer and the conversation, for tests and the console.
window.shoalMarkdown = renderMarkdown;
window.shoalChat = { messages: () => messages.map((m) => ({ ...m })) };

// --- server ---

// errorText finds the message of an OpenAI error body ({"error": {...}})
// or of the dashboard's ({"error": "..."}).
function errorText(body) {
  const e = body && body.error;
  if (!e) return '';
  if (typeof e === 'string') return e;
  return e.message || JSON.stringify(e);
}

async function failure(r) {
  let msg = '';
  try { msg = errorText(await r.json()); } catch (e) { /* not JSON */ }
  return `${r.status} ${r.statusText || ''}`.trim() + (msg ? ': ' + msg : '');
}

async function get(path) {
  const r = await fetch(path, { headers: { Authorization: 'Bearer ' + apiKey }, cache: 'no-store' });
  if (r.status === 401 || r.status === 403) throw new AuthError(await failure(r));
  if (!r.ok) throw new Error(path + ': ' + await failure(r));
  return r.json();
}

// readSSE reads a text/event-stream body and calls onEvent with each
// event ({event, data}) and onBatch after each piece read from the network.
async function readSSE(body, onEvent, onBatch) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = '';
  const take = () => {
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const raw = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let event = 'message';
      const data = [];
      for (let line of raw.split('\n')) {
        line = line.replace(/\r$/, '');
        if (line === '' || line[0] === ':') continue; // a keepalive comment
        const c = line.indexOf(':');
        const field = c < 0 ? line : line.slice(0, c);
        const value = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
        if (field === 'event') event = value;
        else if (field === 'data') data.push(value);
      }
      if (data.length) onEvent({ event, data: data.join('\n') });
    }
  };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n/g, '\n');
    take();
    onBatch();
  }
  buf += dec.decode() + '\n\n';
  take();
  onBatch();
}

// --- page ---

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? '' : String(c)));
  return e;
}

function showError(msg) {
  $('chat-error').textContent = msg || '';
  $('chat-error').hidden = !msg;
}

function setState(state, note) {
  document.body.dataset.state = state;
  const streaming = state === 'streaming';
  $('stop').disabled = !streaming;
  $('send').disabled = streaming || state === 'loading';
  $('log').setAttribute('aria-busy', streaming ? 'true' : 'false');
  $('chat-status').textContent = note != null ? note : streaming ? 'generating…' : '';
}

function addMessage(role, text) {
  $('chat-empty').hidden = true;
  const body = el('div', { class: role === 'user' ? 'text' : 'md' });
  if (role === 'user') body.textContent = text; // shown as typed, never as HTML
  const meta = el('div', { class: 'meta muted' });
  const msg = el('article', { class: 'msg ' + role, 'data-role': role },
    el('div', { class: 'who' }, role === 'user' ? 'you' : role), body, meta);
  $('log').append(msg);
  scrollDown(true);
  return { msg, body, meta };
}

function scrollDown(force) {
  const doc = document.scrollingElement || document.documentElement;
  if (force || doc.scrollHeight - doc.scrollTop - doc.clientHeight < 120) doc.scrollTop = doc.scrollHeight;
}

const fmt = (v, d) => v.toLocaleString('en-US', { minimumFractionDigits: d, maximumFractionDigits: d });

// describe is an answer's meta line: tokens (the usage when the server
// sent it, else the chunks counted), decode speed and time to first token.
function describe(st) {
  const tokens = st.usage && st.usage.completion_tokens != null ? st.usage.completion_tokens : st.chunks;
  const parts = [`${tokens} token${tokens === 1 ? '' : 's'}`];
  const now = st.tLast || performance.now();
  if (tokens > 1 && st.tLast > st.tFirst) parts.push(fmt((tokens - 1) / ((st.tLast - st.tFirst) / 1000), 1) + ' tok/s');
  else if (tokens > 0 && now > st.t0) parts.push(fmt(tokens / ((now - st.t0) / 1000), 1) + ' tok/s');
  if (st.tFirst) parts.push('TTFT ' + fmt(st.tFirst - st.t0, 0) + ' ms');
  if (st.usage && st.usage.prompt_tokens != null) parts.push(`prompt ${st.usage.prompt_tokens}`);
  if (st.finish) parts.push('finish: ' + st.finish);
  if (st.stopped) parts.push('stopped');
  return parts.join(' · ');
}

async function send() {
  if (busy) return;
  const text = $('prompt').value;
  if (!text.trim()) return;
  const model = $('model').value;
  if (!model) { showError('Pick a model first.'); return; }
  if (!apiKey) { askKey(''); return; }
  showError('');
  localStorage.setItem(MODEL_STORE, model);
  $('prompt').value = '';
  messages.push({ role: 'user', content: text });
  const user = addMessage('user', text);
  const ans = addMessage('assistant', '');
  ans.msg.dataset.state = 'streaming';

  const req = { model, messages: messages.slice(), stream: true, stream_options: { include_usage: true } };
  const system = $('system').value.trim();
  if (system) req.messages.unshift({ role: 'system', content: system });
  const maxTokens = parseInt($('max-tokens').value, 10);
  if (maxTokens > 0) req.max_tokens = maxTokens;
  const temp = parseFloat($('temperature').value);
  if (isFinite(temp) && temp >= 0) req.temperature = temp;

  const controller = new AbortController();
  const mine = chatID;
  busy = { controller };
  setState('streaming');
  const st = { text: '', thought: '', chunks: 0, usage: null, finish: '', t0: performance.now(), tFirst: 0, tLast: 0, done: false, stopped: false, error: '' };
  let shown = -1;
  const draw = () => {
    if (st.text.length + st.thought.length !== shown) {
      // A reasoning model's thinking (reasoning_content) in a fold above
      // the answer, open while it is all there is. Escaped by the renderer.
      const thinking = st.thought
        ? '<details class="thinking"' + (st.text ? '' : ' open') + '><summary>Thinking</summary>' + renderMarkdown(st.thought) + '</details>'
        : '';
      ans.body.innerHTML = thinking + renderMarkdown(st.text);
      shown = st.text.length + st.thought.length;
      scrollDown(false);
    }
    ans.msg.dataset.chunks = String(st.chunks);
    ans.msg.dataset.chars = String(st.text.length);
    ans.meta.textContent = describe(st);
  };
  const onEvent = (ev) => {
    if (ev.data === '[DONE]') { st.done = true; return; }
    let obj;
    try { obj = JSON.parse(ev.data); } catch (e) {
      if (ev.event === 'error') st.error = ev.data;
      return;
    }
    if (ev.event === 'error' || (obj && obj.error)) {
      st.error = errorText(obj) || ev.data;
      return;
    }
    if (obj.usage) st.usage = obj.usage;
    for (const c of obj.choices || []) {
      if (c.index) continue; // one answer is asked for
      const piece = c.delta && c.delta.content;
      const thought = c.delta && c.delta.reasoning_content;
      if (piece || thought) {
        const now = performance.now();
        if (!st.tFirst) st.tFirst = now;
        st.tLast = now;
        if (piece) st.text += piece;
        if (thought) st.thought += thought;
        st.chunks++;
      }
      if (c.finish_reason) st.finish = c.finish_reason;
    }
  };
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', cache: 'no-store', signal: controller.signal,
      headers: { Authorization: 'Bearer ' + apiKey, 'Content-Type': 'application/json', Accept: 'text/event-stream' },
      body: JSON.stringify(req),
    });
    if (!r.ok) {
      st.error = await failure(r);
      if (r.status === 401) askKey(st.error);
    } else {
      await readSSE(r.body, onEvent, draw);
      if (!st.done && !st.error) st.error = 'the stream ended before the answer was complete';
    }
  } catch (e) {
    if (e.name === 'AbortError') st.stopped = true;
    else st.error = String(e.message || e);
  }
  draw();
  busy = null;
  if (mine !== chatID) { // "New chat" while it streamed: the page was cleared
    setState('ready', '');
    return;
  }
  if (st.text || st.thought) {
    // A stopped answer is kept as it stands; one that only thought is an
    // empty turn, so that the next question does not follow this one.
    messages.push({ role: 'assistant', content: st.text });
  } else if (st.error) {
    messages.pop(); // not answered: not part of the conversation; its text goes back in the box
    user.msg.classList.add('unanswered');
    if (!$('prompt').value) $('prompt').value = text;
  }
  if (st.error) {
    ans.msg.classList.add('failed');
    ans.msg.append(el('p', { class: 'error' }, 'Error: ' + st.error));
    showError(st.error);
  }
  ans.msg.dataset.state = st.error ? 'error' : st.stopped ? 'stopped' : 'done';
  setState('ready', st.error ? 'failed' : st.stopped ? 'stopped' : '');
  $('prompt').focus();
}

function stop() {
  if (busy) busy.controller.abort();
}

function newChat() {
  stop();
  chatID++;
  messages = [];
  $('log').replaceChildren($('chat-empty'));
  $('chat-empty').hidden = false;
  showError('');
  $('prompt').focus();
}

async function loadModels() {
  setState('loading', 'loading models…');
  try {
    const list = await get('/v1/models');
    const ids = ((list && list.data) || []).map((m) => m.id);
    const want = params.get('model') || localStorage.getItem(MODEL_STORE) || '';
    const sel = $('model');
    sel.replaceChildren(...(ids.length ? ids.map((id) => el('option', { value: id }, id)) : [el('option', { value: '' }, 'no model served')]));
    if (ids.includes(want)) sel.value = want;
    showError('');
    setState('ready', ids.length ? '' : 'this agent serves no model');
  } catch (e) {
    if (e instanceof AuthError) { askKey(e.message); return; }
    showError('Could not list the models: ' + e.message);
    setState('ready', '');
  }
}

function askKey(msg) {
  $('key-error').textContent = msg || '';
  $('key-error').hidden = !msg;
  $('key-dialog').hidden = false;
  document.body.dataset.state = 'nokey';
  $('api-key').value = '';
  $('api-key').focus();
}

function start() {
  $('key-dialog').hidden = true;
  loadModels();
}

document.addEventListener('DOMContentLoaded', () => {
  const mt = parseInt(params.get('max_tokens'), 10);
  if (mt > 0) $('max-tokens').value = String(mt);
  $('key-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    apiKey = $('api-key').value.trim();
    if (!apiKey) return;
    localStorage.setItem(KEY_STORE, apiKey);
    start();
  });
  $('change-key').addEventListener('click', () => askKey(''));
  window.addEventListener('shoal:key', () => { // a login link opened on this page
    apiKey = localStorage.getItem(KEY_STORE) || '';
    if (apiKey) start();
  });
  $('chat-form').addEventListener('submit', (ev) => { ev.preventDefault(); send(); });
  $('prompt').addEventListener('keydown', (ev) => {
    if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); }
    else if (ev.key === 'Escape' && busy) { ev.preventDefault(); stop(); }
  });
  $('stop').addEventListener('click', stop);
  $('new-chat').addEventListener('click', newChat);
  if (apiKey) start(); else askKey('');
});
