"""The report's inline stylesheet and script (no external assets: the file is mailed or attached as is).

The script sorts and filters tables, switches graph pages, and links a graph node to its gap-table row both
ways; it reads node details and the deduplicated stack traces from the ``<script id="edata">`` JSON block.
"""

CSS = """
*{box-sizing:border-box}
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:0 auto;padding:12px 16px;color:#1c1c1c;
 max-width:1400px;overflow-wrap:anywhere}
h1{font-size:21px;margin:8px 0}h2{font-size:17px;margin-top:26px}
nav a{margin-right:12px;font-size:13px}
table{border-collapse:collapse;font-size:12px}
th,td{border:1px solid #ddd;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f3f3f3;cursor:pointer;position:sticky;top:0;z-index:1}
.scroll{overflow:auto;max-width:100%;max-height:80vh;border:1px solid #eee}
#gaps th,#gaps td{white-space:nowrap;overflow-wrap:normal}#gaps td.w{white-space:normal;min-width:140px;max-width:320px}
tr.culprit td{background:#fde8e8}tr.first td{background:#fff3cd}tr.sel td{outline:2px solid #1971c2}
td.rowlink{cursor:pointer;color:#1971c2;text-decoration:underline}
.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.summary td{border:none;padding:2px 12px 2px 0;font-size:13px}
details{font-size:11px}pre{white-space:pre-wrap;margin:2px 0;font-size:11px}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:middle;border:1px solid #aaa}
p.warn{background:#fff3cd;padding:6px;border-left:4px solid #e0a800}
p.answer{font-size:15px;margin:6px 0}p.answer.lost{background:#fff0f6;padding:6px;border-left:4px solid #a61e4d}
svg.chart,svg.generation{max-width:100%;height:auto}
.gbox{display:grid;grid-template-columns:minmax(0,1fr) 340px;gap:10px}
@media (max-width:800px){.gbox{grid-template-columns:minmax(0,1fr)}}
.gwrap{overflow:auto;max-height:80vh;border:1px solid #ddd;background:#fcfcfc}
.panel{border:1px solid #ddd;padding:8px;font-size:12px;max-height:80vh;overflow:auto}
.panel table{width:100%}.panel th{position:static;cursor:default;width:35%}
svg.graph text{font-size:11px;font-family:ui-monospace,monospace;pointer-events:none}
svg.graph .edges path{fill:none;stroke:#adb5bd;stroke-width:1}
.gn{cursor:pointer}.gn rect{stroke:#868e96;stroke-width:1}.gn.norow rect{stroke-dasharray:3 2}
.gn.culprit rect{stroke:#a61e4d;stroke-width:3}.gn.sel rect{stroke:#1971c2;stroke-width:3}
.gn .star{fill:#a61e4d;font-size:12px}
.stub line{stroke:#495057;stroke-width:2}.stub{cursor:pointer}
.gp rect{fill:#e7f5ff;fill-opacity:.35;stroke:#1971c2;stroke-dasharray:6 3}.gp text{fill:#1971c2}.gp{cursor:pointer}
.pages{margin:6px 0;display:flex;flex-wrap:wrap;gap:4px;font-size:12px;align-items:center}
.pg{font-size:12px;padding:2px 6px;border:1px solid #adb5bd;background:#fff;border-radius:3px;cursor:pointer}
.pg.on{border-color:#1971c2;background:#e7f5ff}.pg i{display:inline-block;width:8px;height:8px;margin-left:3px}
.filters{display:flex;flex-wrap:wrap;gap:8px;margin:6px 0;font-size:13px}
.filters input{min-width:0;flex:1 1 180px}
ol.culprits li{margin:4px 0;font-size:13px}
.heatmap td{padding:2px 5px;font-size:12px}.heatmap th.rot{vertical-align:bottom}
.heatmap th.rot div{writing-mode:vertical-rl;transform:rotate(180deg);font-size:11px;white-space:nowrap}
"""

JS = """
const D=JSON.parse(document.getElementById('edata').textContent);
const $=(s,e=document)=>[...e.querySelectorAll(s)];
const esc=s=>String(s??'').replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
const traces=t=>String(t||'').split(',').filter(x=>x!=='').map(i=>'<pre>'+esc(D.traces[+i])+'</pre>').join('');
$('table.sortable th').forEach((th,i)=>th.addEventListener('click',()=>{
 const t=th.closest('table'),b=t.tBodies[0],rows=[...b.rows],asc=th.dataset.asc!=='1';th.dataset.asc=asc?'1':'0';
 rows.sort((x,y)=>{const a=x.cells[i].dataset.v??x.cells[i].innerText,c=y.cells[i].dataset.v??y.cells[i].innerText;
  const na=parseFloat(a),nc=parseFloat(c);const r=(!isNaN(na)&&!isNaN(nc))?na-nc:a.localeCompare(c);return asc?r:-r});
 rows.forEach(r=>b.appendChild(r));}));
$('details[data-t]').forEach(d=>d.addEventListener('toggle',()=>{if(d.open&&!d.dataset.done){
 d.insertAdjacentHTML('beforeend',traces(d.dataset.t));d.dataset.done='1';}}));
const flt=document.getElementById('flt'),fv=document.getElementById('fv');
function filter(){const q=(flt?.value||'').toLowerCase(),v=fv?.value||'';let n=0;
 $('#gaps tbody tr').forEach(r=>{const ok=(!q||r.textContent.toLowerCase().includes(q))&&(!v||
  (v==='culprit'?r.classList.contains('culprit'):v==='delegate'?r.dataset.d==='1':r.dataset.verdict===v));
  r.hidden=!ok;n+=ok;});const c=document.getElementById('fcount');if(c)c.textContent=n+' rows';}
flt?.addEventListener('input',filter);fv?.addEventListener('change',filter);
function page(k){$('.gpage').forEach(p=>p.hidden=p.dataset.page!==String(k));
 $('.pg').forEach(b=>b.classList.toggle('on',b.dataset.page===String(k)));}
$('.pg').forEach(b=>b.addEventListener('click',()=>page(b.dataset.page)));
let sel=null;const panel=document.getElementById('nodeinfo');
function rowTable(r){const tr=document.getElementById('r'+r);if(!tr)return '<p>No gap-table row (not compared).</p>';
 const hs=$('#gaps thead th').map(t=>t.textContent);$('#gaps tr.sel').forEach(x=>x.classList.remove('sel'));
 tr.classList.add('sel');return '<table>'+[...tr.cells].slice(0,-1).map((c,i)=>'<tr><th>'+esc(hs[i])+'</th><td>'+
 c.innerHTML+'</td></tr>').join('')+'</table><p><a href="#r'+r+'">show the row in the table</a></p>';}
function show(id,scroll){const g=document.getElementById('gn-'+id);if(!g)return;
 page(g.closest('.gpage').dataset.page);sel?.classList.remove('sel');g.classList.add('sel');sel=g;
 const n=D.nodes[id]||{};panel.innerHTML='<b>'+esc(n.op)+'</b> <small>'+esc((n.names||[]).join(', '))+
 '</small><br>handle '+esc(n.h)+(n.part?' · delegate '+esc(n.part):'')+(n.mod?' · module '+esc(n.mod):'')+
 '<br><code>'+esc(n.src)+'</code>'+(g.dataset.row!==undefined?rowTable(g.dataset.row):'<p>Not compared.</p>')+
 '<details open><summary>stack trace</summary>'+traces(n.tr)+'</details>';
 if(scroll)g.scrollIntoView({block:'center',inline:'center'});}
$('.gn').forEach(g=>g.addEventListener('click',()=>show(g.dataset.id,false)));
$('.stub').forEach(s=>s.addEventListener('click',()=>show(s.dataset.go,true)));
$('.gp').forEach(p=>p.addEventListener('click',e=>{if(p.dataset.row!==undefined){panel.innerHTML='<b>'+
 esc(p.dataset.part)+'</b> (DELEGATE_CALL)'+rowTable(p.dataset.row);}}));
$('[data-node]').forEach(el=>{const c=el.tagName==='TR'?el.cells[0]:el;c.classList.add('rowlink');
 c.title='show in the graph';c.addEventListener('click',()=>{show(el.dataset.node,true);
 document.getElementById('graph')?.scrollIntoView();});});
"""
