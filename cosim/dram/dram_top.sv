// DRAM device model and trace-player tops around the Amaranth DRAM controller
// (coda.hw.dram.controller). Everything runs on the DRAM command clock; no Python per clock.
//
// coda_dram_device: behavioural rank. Stores bursts in an array of 2**STORE_BITS entries
// indexed by the low bits of {row, bank, bankgroup, column burst}; a WR writes its burst
// (byte mask) at the command, a RD returns its burst RL = CL + nBL cycles later on
// rd_valid/rd_data (data captured at the command; rd_data holds the last burst otherwise).
// Plusargs:
//   +dram_cmds=FILE   command log CSV: cycle,channel,rank,bankgroup,bank,command,row,column
//                     (devices other than channel 0 rank 0 append .c<ch>r<rank> to FILE)
//   +dram_init=FILE   $readmemh initial contents;  +dram_dump=FILE  $writememh at the end
// With CODA_DRAM_SHM defined (the DIMM-NMP cosimulation, cosim/nmp/nmp_top.sv) there is no HDL
// array: the bursts live in the rank memory the host maps too (cosim/shared_mem.py; DPI-C
// side cosim/shared_mem.cpp), the file +MEM_SHM=PREFIX with ".<SHM_INDEX>" appended, whose
// burst map takes a device index to the burst of the NME's image it holds; a RD reads the
// burst from it at the command, a WR writes its masked bytes at the command, as the array
// would (+dram_init / +dram_dump do not apply).
// With CODA_RANKS defined (coda dram replay --ranks > 1) the device is the 2**RANK_BITS ranks
// of one channel: cmd_rank selects the rank (logged as RANK + cmd_rank; in the store index).
`default_nettype none

module coda_dram_device #(
    parameter int BG_BITS = 2, BA_BITS = 2, ROW_BITS = 16, COL_BITS = 10, BL_BITS = 3,
    parameter int DATA_BITS = 512, RL = 26, STORE_BITS = 12, CHANNEL = 0, RANK = 0,
    parameter int RANK_BITS = 1, SHM_INDEX = 0
) (
    input  wire clk, input wire rst,
`ifdef CODA_RANKS
    input  wire [RANK_BITS-1:0] cmd_rank,
`endif
    input  wire [2:0] cmd_kind,
    input  wire [BG_BITS-1:0] cmd_bg, input wire [BA_BITS-1:0] cmd_ba,
    input  wire [ROW_BITS-1:0] cmd_row, input wire [COL_BITS-1:0] cmd_col,
    input  wire [DATA_BITS-1:0] cmd_wdata, input wire [DATA_BITS/8-1:0] cmd_wmask,
    output logic rd_valid, output logic [DATA_BITS-1:0] rd_data
);
`ifdef CODA_RANKS
    localparam int FULL = ROW_BITS + BA_BITS + BG_BITS + COL_BITS - BL_BITS + RANK_BITS;
    wire [FULL-1:0] full = {cmd_row, cmd_ba, cmd_bg, cmd_col[COL_BITS-1:BL_BITS], cmd_rank};
    wire [31:0] log_rank = RANK + 32'(cmd_rank);
`else
    localparam int FULL = ROW_BITS + BA_BITS + BG_BITS + COL_BITS - BL_BITS;
    wire [FULL-1:0] full = {cmd_row, cmd_ba, cmd_bg, cmd_col[COL_BITS-1:BL_BITS]};
    wire [31:0] log_rank = RANK;
`endif
    wire [STORE_BITS-1:0] idx = full[STORE_BITS-1:0];
`ifdef CODA_DRAM_SHM
    import "DPI-C" function int coda_mem_open_bursts(input string path, input int burst_bytes,
                                                     input int nidx);
    import "DPI-C" function void coda_mem_read_burst(input int h, input int idx,
                                                     output bit [DATA_BITS-1:0] data);
    import "DPI-C" function void coda_mem_write_burst(input int h, input int idx,
                                                      input bit [DATA_BITS-1:0] data,
                                                      input bit [DATA_BITS/8-1:0] mask);
    int shm = -1;                      // the rank memory's handle (shared_mem.cpp)
    initial begin
        string prefix, path;
        if (!$value$plusargs("MEM_SHM=%s", prefix)) $fatal(1, "+MEM_SHM=PREFIX missing");
        path = $sformatf("%s.%0d", prefix, SHM_INDEX);
        shm = coda_mem_open_bursts(path, DATA_BITS / 8, 1 << STORE_BITS);
        if (shm < 0) $fatal(1, "%s: cannot map a memory of %0d-byte bursts at %0d indexes (error %0d)",
                            path, DATA_BITS / 8, 1 << STORE_BITS, shm);
    end
`else
    logic [DATA_BITS-1:0] store [0:(1<<STORE_BITS)-1];
`endif
    // read data ring: slot (t mod RL) written by a RD at t is read back at t + RL
    logic [DATA_BITS-1:0] ring_d [0:RL-1];
    logic [RL-1:0] ring_v;
    int unsigned slot;
    longint unsigned cycle;
    integer log_fd = 0;
    string fname, kind_s;

    initial begin
        if ($value$plusargs("dram_cmds=%s", fname)) begin
            if (CHANNEL != 0 || RANK != 0) fname = $sformatf("%s.c%0dr%0d", fname, CHANNEL, RANK);
            log_fd = $fopen(fname, "w");
            $fwrite(log_fd, "cycle,channel,rank,bankgroup,bank,command,row,column\n");
        end
`ifndef CODA_DRAM_SHM
        if ($value$plusargs("dram_init=%s", fname)) $readmemh(fname, store);
`endif
    end
    final begin
`ifndef CODA_DRAM_SHM
        if ($value$plusargs("dram_dump=%s", fname)) $writememh(fname, store);
`endif
        if (log_fd != 0) $fclose(log_fd);
    end

    // rd_valid/rd_data are registers loaded one cycle ahead from the next slot, so the wide
    // data moves only when a burst returns (a cheaper model: nothing copies 512 bits a cycle)
    int unsigned next_slot;
    assign next_slot = (slot == RL - 1) ? 0 : slot + 1;
    initial if (RL < 2) $fatal(1, "coda_dram_device: RL=%0d, expected >= 2", RL);

    always_ff @(posedge clk) begin
        if (rst) begin
            cycle <= 0; slot <= 0; ring_v <= '0; rd_valid <= 1'b0;
        end else begin
            cycle <= cycle + 1;
            slot <= next_slot;
            ring_v[slot] <= (cmd_kind == 3'd4);
            rd_valid <= ring_v[next_slot];
            if (ring_v[next_slot]) rd_data <= ring_d[next_slot];
`ifdef CODA_DRAM_SHM
            if (cmd_kind == 3'd4) begin
                bit [DATA_BITS-1:0] burst;
                coda_mem_read_burst(shm, 32'(idx), burst);
                ring_d[slot] <= burst;
            end
            if (cmd_kind == 3'd5) coda_mem_write_burst(shm, 32'(idx), cmd_wdata, cmd_wmask);
`else
            if (cmd_kind == 3'd4) ring_d[slot] <= store[idx];
            if (cmd_kind == 3'd5)
                for (int i = 0; i < DATA_BITS / 8; i++)
                    if (cmd_wmask[i]) store[idx][8*i +: 8] <= cmd_wdata[8*i +: 8];
`endif
            if (log_fd != 0 && cmd_kind != 3'd0) begin
                case (cmd_kind)
                    3'd1: kind_s = "ACT"; 3'd2: kind_s = "PRE"; 3'd3: kind_s = "PREA";
                    3'd4: kind_s = "RD";  3'd5: kind_s = "WR";  3'd7: kind_s = "REFsb";
                    default: kind_s = "REF";
                endcase
                if (cmd_kind == 3'd3 || cmd_kind == 3'd6)
                    $fwrite(log_fd, "%0d,%0d,%0d,,,%s,,\n", cycle, CHANNEL, log_rank, kind_s);
                else if (cmd_kind == 3'd7)   // same-bank refresh: bank address only
                    $fwrite(log_fd, "%0d,%0d,%0d,,%0d,%s,,\n", cycle, CHANNEL, log_rank, cmd_ba,
                            kind_s);
                else
                    $fwrite(log_fd, "%0d,%0d,%0d,%0d,%0d,%s,%0d,%0d\n", cycle, CHANNEL, log_rank,
                            cmd_bg, cmd_ba, kind_s, cmd_row,
                            (cmd_kind == 3'd4 || cmd_kind == 3'd5) ? cmd_col : 0);
            end
        end
    end
endmodule

// Burst-trace player: +trace=FILE of hex lines "CYCLE WE ADDR" (burst address), each
// request offered no earlier than CYCLE, in file order; +stats=FILE gets key=value lines at
// the end; +max_cycles=N stops a run that would not finish.
module coda_dram_replay_top #(
    parameter int BG_BITS = 2, BA_BITS = 2, ROW_BITS = 16, COL_BITS = 10, BL_BITS = 3,
    parameter int DATA_BITS = 512, RL = 26, STORE_BITS = 12, ADDR_BITS = 27, RANK_BITS = 1
) (input wire clk, input wire rst);
    logic req_valid, req_ready, rsp_valid, idle;
`ifdef CODA_RANKS
    logic [RANK_BITS-1:0] cmd_rank;
`endif
    logic [ADDR_BITS-1:0] t_addr;
    logic t_we, have, eof, started;
    longint unsigned t_cycle, max_cycles, accepted, responses;
    logic [DATA_BITS-1:0] rsp_data, rd_data;
    logic rd_valid;
    logic [2:0] cmd_kind;
    logic [BG_BITS-1:0] cmd_bg; logic [BA_BITS-1:0] cmd_ba;
    logic [ROW_BITS-1:0] cmd_row; logic [COL_BITS-1:0] cmd_col;
    logic [DATA_BITS-1:0] cmd_wdata; logic [DATA_BITS/8-1:0] cmd_wmask;
    logic [47:0] s_reads, s_writes, s_hits, s_misses, s_conflicts, s_lat, s_cycles, s_refs;
    integer fd = 0, n;
    string fname;

    coda_dram_ctrl ctrl (
        .clk(clk), .rst(rst),
        .req_valid(req_valid), .req_ready(req_ready), .req_we(t_we), .req_addr(t_addr),
        .req_wdata({(DATA_BITS/32){{(32-ADDR_BITS%32)%32{1'b0}}, t_addr}}),
        .req_wmask({(DATA_BITS/8){1'b1}}),
        .rsp_valid(rsp_valid), .rsp_data(rsp_data),
`ifdef CODA_RANKS
        .cmd_rank(cmd_rank),
`endif
        .cmd_kind(cmd_kind), .cmd_bg(cmd_bg), .cmd_ba(cmd_ba), .cmd_row(cmd_row),
        .cmd_col(cmd_col), .cmd_wdata(cmd_wdata), .cmd_wmask(cmd_wmask),
        .rd_valid(rd_valid), .rd_data(rd_data), .idle(idle),
        .stat_reads(s_reads), .stat_writes(s_writes), .stat_row_hits(s_hits),
        .stat_row_misses(s_misses), .stat_row_conflicts(s_conflicts),
        .stat_read_latency(s_lat), .stat_cycles(s_cycles), .stat_refreshes(s_refs));

    coda_dram_device #(.BG_BITS(BG_BITS), .BA_BITS(BA_BITS), .ROW_BITS(ROW_BITS),
        .COL_BITS(COL_BITS), .BL_BITS(BL_BITS), .DATA_BITS(DATA_BITS), .RL(RL),
        .STORE_BITS(STORE_BITS), .RANK_BITS(RANK_BITS)) dev (
        .clk(clk), .rst(rst), .cmd_kind(cmd_kind), .cmd_bg(cmd_bg), .cmd_ba(cmd_ba),
`ifdef CODA_RANKS
        .cmd_rank(cmd_rank),
`endif
        .cmd_row(cmd_row), .cmd_col(cmd_col), .cmd_wdata(cmd_wdata), .cmd_wmask(cmd_wmask),
        .rd_valid(rd_valid), .rd_data(rd_data));

    initial begin
        if (!$value$plusargs("trace=%s", fname)) $fatal(1, "+trace=FILE missing");
        fd = $fopen(fname, "r");
        if (fd == 0) $fatal(1, "cannot open trace %s", fname);
        if (!$value$plusargs("max_cycles=%d", max_cycles)) max_cycles = 64'd1 << 40;
    end

    assign req_valid = have && (64'(s_cycles) >= t_cycle);

    task automatic next_request();
        logic [63:0] c, w, a;
        n = $fscanf(fd, "%h %h %h\n", c, w, a);
        if (n == 3) begin
            have <= 1; t_cycle <= c; t_we <= w[0]; t_addr <= a[ADDR_BITS-1:0];
        end else begin
            have <= 0; eof <= 1;
        end
    endtask

    task automatic finish(input int timed_out);
        integer sf;
        if ($value$plusargs("stats=%s", fname)) begin
            sf = $fopen(fname, "w");
            $fwrite(sf, "requests=%0d\nreads=%0d\nwrites=%0d\nrow_hits=%0d\nrow_misses=%0d\n",
                    accepted, s_reads, s_writes, s_hits, s_misses);
            $fwrite(sf, "row_conflicts=%0d\nread_latency=%0d\ncycles=%0d\nrefreshes=%0d\n",
                    s_conflicts, s_lat, s_cycles, s_refs);
            $fwrite(sf, "responses=%0d\ntimed_out=%0d\n", responses, timed_out);
            $fclose(sf);
        end
        $finish;
    endtask

    always_ff @(posedge clk) begin
        if (rst) begin
            have <= 0; eof <= 0; accepted <= 0; responses <= 0; started <= 0;
        end else if (!started) begin
            started <= 1;
            next_request();
        end else begin
            if (rsp_valid) responses <= responses + 1;
            if (req_valid && req_ready) begin
                accepted <= accepted + 1;
                next_request();
            end
            if (eof && !have && idle) finish(0);
            else if (64'(s_cycles) >= max_cycles) finish(1);
        end
    end
endmodule

// Word-port player for the NME-side memory (coda_dram_words = WordAdapter + controller):
// +words=FILE of hex lines "WE ADDR WDATA WMASK" offered back to back; every response word
// is written as a hex line to +rsp=FILE; finishes when all is accepted, answered and idle.
module coda_dram_word_top #(
    parameter int BG_BITS = 2, BA_BITS = 2, ROW_BITS = 16, COL_BITS = 10, BL_BITS = 3,
    parameter int DATA_BITS = 512, RL = 26, STORE_BITS = 12, WORD_BITS = 128, LANES = 8
) (input wire clk, input wire rst);
    logic req_valid, req_ready, rsp_valid, idle, w_we, have, eof, started;
    logic [23:0] w_addr;
    logic [WORD_BITS-1:0] w_data, rsp_data;
    logic [LANES-1:0] w_mask;
    logic [DATA_BITS-1:0] rd_data;
    logic rd_valid;
    logic [2:0] cmd_kind;
    logic [BG_BITS-1:0] cmd_bg; logic [BA_BITS-1:0] cmd_ba;
    logic [ROW_BITS-1:0] cmd_row; logic [COL_BITS-1:0] cmd_col;
    logic [DATA_BITS-1:0] cmd_wdata; logic [DATA_BITS/8-1:0] cmd_wmask;
    longint unsigned reads, responses, cyc;
    integer fd = 0, out_fd = 0, n;
    string fname;

    coda_dram_words mem (
        .clk(clk), .rst(rst),
        .mem_req_valid(req_valid), .mem_req_ready(req_ready), .mem_req_we(w_we),
        .mem_req_addr(w_addr), .mem_req_wdata(w_data), .mem_req_wmask(w_mask),
        .mem_rsp_valid(rsp_valid), .mem_rsp_data(rsp_data),
        .cmd_kind(cmd_kind), .cmd_bg(cmd_bg), .cmd_ba(cmd_ba), .cmd_row(cmd_row),
        .cmd_col(cmd_col), .cmd_wdata(cmd_wdata), .cmd_wmask(cmd_wmask),
        .rd_valid(rd_valid), .rd_data(rd_data), .idle(idle),
        .stat_reads(), .stat_writes(), .stat_row_hits(), .stat_row_misses(),
        .stat_row_conflicts(), .stat_read_latency(), .stat_cycles(), .stat_refreshes());

    coda_dram_device #(.BG_BITS(BG_BITS), .BA_BITS(BA_BITS), .ROW_BITS(ROW_BITS),
        .COL_BITS(COL_BITS), .BL_BITS(BL_BITS), .DATA_BITS(DATA_BITS), .RL(RL),
        .STORE_BITS(STORE_BITS)) dev (
        .clk(clk), .rst(rst), .cmd_kind(cmd_kind), .cmd_bg(cmd_bg), .cmd_ba(cmd_ba),
        .cmd_row(cmd_row), .cmd_col(cmd_col), .cmd_wdata(cmd_wdata), .cmd_wmask(cmd_wmask),
        .rd_valid(rd_valid), .rd_data(rd_data));

    initial begin
        if (!$value$plusargs("words=%s", fname)) $fatal(1, "+words=FILE missing");
        fd = $fopen(fname, "r");
        if (fd == 0) $fatal(1, "cannot open %s", fname);
        if ($value$plusargs("rsp=%s", fname)) out_fd = $fopen(fname, "w");
    end

    assign req_valid = have;

    task automatic next_word();
        logic [63:0] w, a;
        logic [WORD_BITS-1:0] d;
        logic [LANES-1:0] k;
        n = $fscanf(fd, "%h %h %h %h\n", w, a, d, k);
        if (n == 4) begin
            have <= 1; w_we <= w[0]; w_addr <= a[23:0]; w_data <= d; w_mask <= k;
            if (!w[0]) reads <= reads + 1;
        end else begin
            have <= 0; eof <= 1;
        end
    endtask

    always_ff @(posedge clk) begin
        if (rst) begin
            have <= 0; eof <= 0; reads <= 0; responses <= 0; cyc <= 0; started <= 0;
        end else if (!started) begin
            started <= 1;
            next_word();
        end else begin
            cyc <= cyc + 1;
            if (rsp_valid) begin
                responses <= responses + 1;
                if (out_fd != 0) $fwrite(out_fd, "%h\n", rsp_data);
            end
            if (req_valid && req_ready) next_word();
            if (eof && !have && idle && responses == reads) begin
                if (out_fd != 0) $fclose(out_fd);
                $finish;
            end
            if (cyc > 64'd50_000_000) $fatal(1, "word player did not finish");
        end
    end
endmodule
`default_nettype wire
