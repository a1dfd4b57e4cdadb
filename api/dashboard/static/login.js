// shoal login link: a page opened as http://HOST:PORT/#key=KEY (or
// /dashboard/chat#key=KEY) takes the API key from the URL fragment, which
// browsers never send to the server, stores it where the key dialog does,
// and removes it from the address bar and the history. Loaded before
// app.js and chat.js, which read the stored key when they start; a link
// opened on a page already showing fires 'shoal:key' on window.
'use strict';

const shoalLogin = (() => {
  const STORE = 'shoal.apiKey';

  // fromHash returns the key of a "#key=KEY" fragment ('' if none) and
  // the fragment without it.
  function fromHash(hash) {
    const parts = (hash || '').replace(/^#/, '').split('&').filter((p) => p !== '');
    let key = '';
    const rest = [];
    for (const p of parts) {
      if (p.startsWith('key=')) {
        try { key = decodeURIComponent(p.slice(4)).trim(); } catch (e) { key = p.slice(4).trim(); }
      } else {
        rest.push(p);
      }
    }
    return { key, rest: rest.join('&') };
  }

  // take stores the fragment's key and drops it from the URL; it returns
  // whether there was one.
  function take() {
    const { key, rest } = fromHash(location.hash);
    if (!key) return false;
    try { localStorage.setItem(STORE, key); } catch (e) { /* storage disabled: the dialog will ask */ }
    history.replaceState(history.state, '', location.pathname + location.search + (rest ? '#' + rest : ''));
    return true;
  }

  take();
  window.addEventListener('hashchange', () => {
    if (take()) window.dispatchEvent(new CustomEvent('shoal:key'));
  });
  return { STORE, fromHash, take };
})();
